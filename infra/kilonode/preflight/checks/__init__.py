"""One module per preflight check: NAME (stable), TITLE, and check(inputs) -> findings."""
