from shardkit._entry import main

main()
