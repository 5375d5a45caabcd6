"""The one object that talks to Docker: `Engine`, assembled from one part per concern, each in
its module: host.py (the SDK client, `docker info`: platform, GPU access, data root), images.py
(inspect, tag, remove, files out of an image), containers.py (run, exec, logs, wait),
builds.py (BuildKit through a Docker CLI) and endpoint.py (where an engine is); registries
(credentials, HTTP API v2, push and pull) are registry.py. The SDK and the CLI both honour
DOCKER_HOST and Docker contexts (DOCKER_CONTEXT or the current context of ~/.docker/config.json).

Several builders (issue 19): an `Engine(Endpoint)` talks to one named engine (`unix://`,
`ssh://`, `tcp://` with TLS, or a Docker context), its SDK client and its CLI commands alike
(the CLI gets DOCKER_HOST / DOCKER_CONTEXT / DOCKER_CERT_PATH). There is no current or
module-level engine: the command makes one (`stages.Run.docker`) and passes it by hand, each
builder's worker passes its builder's, so every call names the engine that serves it.
"""

from __future__ import annotations

from ..errors import EngineError  # noqa: F401 - engine.EngineError
from .builds import (BuildClient, BuildRequest, Builds, build_client,  # noqa: F401
                     candidate_clients, classic_builder_has_buildkit, docker_cli,
                     parse_client_version, probe_client)
from .containers import Containers, ContainerSpec, Mount  # noqa: F401
from .endpoint import Endpoint, engine_address, parse_builder  # noqa: F401
from .host import DockerFacts, _dropped_connection, host_platform  # noqa: F401
from .images import split_ref  # noqa: F401


class Engine(Containers, Builds):
    """The Docker engine of this run: owns the SDK client (made on first use) and the BuildKit
    CLI; every SDK error comes out as EngineError. Passed by hand: the command makes one
    (`Run.docker`) and every step and function that talks to Docker takes it as an argument,
    so each call says which engine serves it (a builder's, the smoke's, this machine's)."""
