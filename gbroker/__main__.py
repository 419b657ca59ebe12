from gbroker.cli import main

raise SystemExit(main())
