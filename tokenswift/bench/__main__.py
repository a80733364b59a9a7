"""`python -m tokenswift.bench COMMAND ...`: see tokenswift/bench/__init__.py for the commands."""
from .cli import main

raise SystemExit(main())
