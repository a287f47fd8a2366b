"""The per-node agent, ``python -m zlaunch.agent``: one per node, started by a transport.

It reads its node's spec from stdin (with ``--connect HOST:PORT``, from a TCP connection it
makes to the controller and authenticates: `connect`), starts one worker per slot (`workers`), turns their pipes
into frames for the controller (`output`, `upstream`), and stops them when the controller goes
quiet (`loop`). Standard library only: it runs on every node, wherever the job's Python is;
`tests/unit/test_contract.py` holds this whole folder to that.
"""

from zlaunch.agent.connect import ConnectFailed, read_token_file
from zlaunch.agent.loop import Agent, AgentPhase, hello, main

__all__ = ["Agent", "AgentPhase", "ConnectFailed", "hello", "main", "read_token_file"]
