"""``python -m localspec``: the same as the ``localspec`` command."""

from localspec.cli.app import main

main()
