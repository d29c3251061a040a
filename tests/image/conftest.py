"""tests/image: the tests of the node image's build and verify (the testinfra suite
`kilonode image verify` runs against a booted image lives beside the recipe, in node-image/verify/)."""
