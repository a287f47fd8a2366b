from zlaunch.cli import main

main()
