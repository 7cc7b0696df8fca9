from opsctl.cli import main

main()
