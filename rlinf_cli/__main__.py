from rlinf_cli.cli import main

main()
