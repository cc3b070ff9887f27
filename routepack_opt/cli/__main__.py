import sys

from routepack_opt.cli import main

sys.exit(main())
