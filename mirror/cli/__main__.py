import sys

from mirror.cli.commands import main

sys.exit(main())
