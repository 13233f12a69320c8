"""python -m jaxmarket.impulse RUN [--agent I]
[--deviation best_response|best_response_lowest|nash|PRICE]
[--periods T] [--json]: the impulse response of a trained run's strategies to a
one-period deviation (jaxmarket.cli.impulse)."""

from jaxmarket.cli import exit_process, run_cli
from jaxmarket.cli.impulse import main

if __name__ == "__main__":
    exit_process(run_cli(main))
