"""``python -m batchgen`` = the ``batchgen`` console script."""

from batchgen.cli import main

if __name__ == "__main__":
    main()
