import sys

from streamstate_cli.cli import main

sys.exit(main())
