from agentstream.cli import main

main()
