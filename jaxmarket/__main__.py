"""jaxmarket COMMAND [ARGS ...] (python -m jaxmarket): the jaxmarket console script,
jaxmarket.cli.main."""

import sys

from jaxmarket.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
