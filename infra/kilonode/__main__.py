"""`python -m kilonode`: the same as the `kilonode` console script."""

from kilonode.entry import main

main()
