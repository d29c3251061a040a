"""`python -m infra.cli`: the same as the `kilonode` console script."""

from infra.entry import main

main()
