from zlaunch.agent.loop import main

main()
