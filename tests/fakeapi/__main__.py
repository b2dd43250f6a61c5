"""Run the fake apiserver in its own process (benchmarks keep it off the scheduler's interpreter lock):
prints its URL, then serves until stdin closes."""

import sys

from .server import FakeApiServer

server = FakeApiServer().start()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
