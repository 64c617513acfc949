from shardq.coordinator.server import main

main()
