"""The admission webhook as a fault of the chaos soak: fairgpu's own webhook server, registered with the fake
exactly as deploy/webhooks.yaml registers it (rules, selectors, matchConditions, timeouts, failurePolicy),
in front of every pod the soak creates, and stopped and started again while pods arrive. A pod created
while it is down must be refused (failurePolicy Fail) and created again later, never stored unchecked;
the auditor checks every stored pod against the fake's admission log.

The soak drops the webhooks' matchConditions: the fake evaluates CEL with cel-python at 10–25 ms a pod, which
at a soak's arrival rate starves the fake's loop (leases then lapse for the fake's sake, not fairgpu's). Every
soak pod asks for GPUs and so matches them anyway; tests/test_perimeter.py tests the conditions themselves."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import yaml

from fairgpu.k8s.identity import Trust
from fairgpu.k8s.port import Kind, KubePort
from fairgpu.k8s.webhook import webhook_app
from fairgpu.k8s.webhook_server import WebhookServer
from fakeapi.server import FakeEndpoint
from test_webhook import make_cert

WEBHOOKS = Path(__file__).resolve().parent.parent / "deploy" / "webhooks.yaml"
POD_WEBHOOKS = ("pods.mutate.fairgpu.io", "pods.validate.fairgpu.io")  # every tenant pod must pass both
CONFIGS = {
    kind: Kind("admissionregistration.k8s.io", "v1", f"{kind.lower()}s", False)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
}


class ChaosWebhook:
    def __init__(self, tmp: Path, queues: dict[str, tuple[str, ...]]) -> None:
        self.cert, self.key = tmp / "webhook.crt", tmp / "webhook.key"
        make_cert(self.cert, self.key)
        self.queues = queues
        self.server = self._serve(0)
        self.port = self.server.port
        self.restarts = 0

    async def register(self, fake: FakeEndpoint, port: KubePort, policy: str | None = None) -> None:
        """deploy/webhooks.yaml with the CA injected (cert-manager's part), its Service resolved to the server;
        `policy` overrides every failurePolicy (a test's deliberate mistake)."""
        ca = base64.b64encode(self.cert.read_bytes()).decode()
        for doc in yaml.safe_load_all(WEBHOOKS.read_text()):
            for hook in doc["webhooks"]:
                hook["clientConfig"]["caBundle"] = ca
                hook["failurePolicy"] = policy or hook["failurePolicy"]
                hook.pop("matchConditions", None)
                svc = hook["clientConfig"]["service"]
            await port.create(CONFIGS[doc["kind"]], doc)
        fake.control("service", namespace=svc["namespace"], name=svc["name"], address=f"127.0.0.1:{self.port}")

    def _serve(self, port: int) -> WebhookServer:
        app = lambda: webhook_app(self.queues.get, "fairgpu", Trust())  # noqa: E731
        return WebhookServer(app, "127.0.0.1", port, str(self.cert), str(self.key)).start()

    async def restart(self, down_s: float) -> None:
        """Stop the server, leave it down for down_s seconds, start a new one on the same address (a new
        webhook pod behind the Service). Off this loop: the replicas on it go on meanwhile."""
        await asyncio.to_thread(self.server.stop)
        self.restarts += 1
        await asyncio.sleep(down_s)
        self.server = await asyncio.to_thread(self._serve, self.port)

    def stop(self) -> None:
        self.server.stop()
