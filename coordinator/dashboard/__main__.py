from shardq.coordinator.dashboard.server import main

raise SystemExit(main())
