"""GPU health: parse what a GPU node reports, and the rules that take a bad one out."""
