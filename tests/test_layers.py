"""The product's folders depend one way: every import between them is read from the source (ast)
and checked against the layers below. A new import pointing the wrong way fails here, naming the
file and the line.

    cli  ─────────────────────────────────► every layer below (it is the top)
    console ───► client ───► common (the `gms` package itself)
    spark_jobs ─► broker, client, common (it reads a store's files with the broker's own code)
    broker, nameserver ───► common
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"common": "common", "broker": "broker", "nameserver": "nameserver", "client": "client",
           "console": "console", "spark_jobs": "spark_jobs", "cli": "cli"}
ALLOWED = {
    "common": set(),
    "broker": {"common"},
    "nameserver": {"common"},
    "client": {"common"},
    "console": {"client", "common"},
    "spark_jobs": {"broker", "client", "common"},
    "cli": {"common", "broker", "nameserver", "client", "console", "spark_jobs"},
}
# `python -m gms.console` runs the CLI's `gms console` command as a server process (as `gms
# standalone` starts it): an entry point above every layer, imported by nothing.
ENTRY_POINTS = {Path("console/__main__.py")}
# Wrong-way imports not removed yet, each with what keeps it. A ratchet: nothing may join the list,
# and the test fails once an entry is no longer needed, so the list only shrinks.
KNOWN: dict[str, str] = {}


def _layer(module: str) -> str | None:
    """The folder of an absolute module name (None: not gms)."""
    parts = module.split(".")
    if parts[0] != "gms":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS and parts[1] != "common" else "common"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every gms import of ``path``, also those under TYPE_CHECKING or
    inside functions (relative imports stay in their own folder)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return found


def wrong_way_imports(root: Path = ROOT) -> list[str]:
    wrong = []
    for layer, folder in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root)
            if relative in ENTRY_POINTS or ".venv" in relative.parts:
                continue
            for line, module in _imports(path):
                target = _layer(module)
                if target is not None and target != layer and target not in ALLOWED[layer]:
                    wrong.append(f"{relative}:{line}: {layer} imports {module} ({target})")
    return wrong


def test_no_import_points_the_wrong_way():
    wrong = wrong_way_imports()
    assert [w for w in wrong if w.split(":")[0] not in KNOWN] == []
    assert sorted({w.split(":")[0] for w in wrong}) == sorted(KNOWN), "an entry of KNOWN is fixed: remove it"


def test_the_check_sees_a_wrong_way_import(tmp_path):
    for folder in FOLDERS.values():
        (tmp_path / folder).mkdir()
    (tmp_path / "broker" / "bad.py").write_text("def f():\n    from gms.client.producer import Producer\n")
    (tmp_path / "common" / "bad.py").write_text("import gms.broker.store\nfrom gms.protocol import rows\n")
    (tmp_path / "console" / "bad.py").write_text("from gms.cli.output import table\nfrom gms.client import Admin\n")
    assert wrong_way_imports(tmp_path) == [
        "common/bad.py:1: common imports gms.broker.store (broker)",
        "broker/bad.py:2: broker imports gms.client.producer (client)",
        "console/bad.py:1: console imports gms.cli.output (cli)",
    ]


# The gms wire protocol's messages stay in its adapter (broker/*_handlers.py): the services take
# and answer typed values, and other protocols' adapters call the services (docs/architecture.md).
FRAME_FREE = ("broker/services", "broker/rocketmq", "broker/kafka")
WIRE_MESSAGES = {"Frame", "Response"}


def frame_uses(root: Path = ROOT) -> list[str]:
    """Where a module of FRAME_FREE imports or builds a gms Frame or Response."""
    found = []
    for folder in FRAME_FREE:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == "gms.protocol.frame":
                    names = {alias.name for alias in node.names} & WIRE_MESSAGES
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    names = {node.func.id} & WIRE_MESSAGES
                else:
                    continue
                found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in sorted(names)]
    return found


def test_services_and_other_protocols_use_no_gms_frame():
    assert frame_uses() == []


def test_the_check_sees_a_frame(tmp_path):
    for folder in FRAME_FREE:
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "broker/rocketmq/bad.py").write_text(
        "from gms.protocol.frame import Buffer, Frame\n\ndef f():\n    return Response({})\n")
    assert frame_uses(tmp_path) == ["broker/rocketmq/bad.py:1: Frame", "broker/rocketmq/bad.py:4: Response"]


# A protocol adapter other than the gms wire handlers reaches the broker's data through the
# services only: not its store, cluster view or replicas, nor the wire handlers.
BROKER_INTERNALS = {"store", "registration", "replicas", "message_handlers", "pop_handlers", "group_handlers",
                    "transaction_handlers"}


def attributes_used(root: Path, path: Path, names: set[str]) -> list[str]:
    """Where ``path`` uses an attribute of one of ``names``."""
    return [f"{path.relative_to(root)}:{node.lineno}: .{node.attr}"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Attribute) and node.attr in names]


# The modules the Kafka endpoint may not import: the store (module or package), the cluster view and
# the registration, replication, and the gms wire handlers. (The RocketMQ endpoint imports the
# store's GetStatus, a type the message service answers.)
INTERNAL_MODULES = ("gms.broker.store", "gms.broker.registration", "gms.cluster.cluster_view", "gms.broker.ha",
                    "gms.broker.commitlog", "gms.broker.consumequeue")
ADAPTERS = ("broker/rocketmq", "broker/kafka")


def _internal(module: str) -> bool:
    return module.endswith("_handlers") or any(module == m or module.startswith(m + ".") for m in INTERNAL_MODULES)


def internals_reached(root: Path = ROOT) -> list[str]:
    found = []
    for folder in ADAPTERS:
        for path in sorted((root / folder).rglob("*.py")):
            found += attributes_used(root, path, BROKER_INTERNALS)
            if folder == "broker/kafka":
                found += [f"{path.relative_to(root)}:{line}: import {module}" for line, module in _imports(path)
                          if _internal(module)]
    return found


def test_protocol_endpoints_reach_the_broker_through_its_services():
    assert internals_reached() == []


def test_the_check_sees_a_reach_into_the_store(tmp_path):
    (tmp_path / "broker/rocketmq").mkdir(parents=True)
    (tmp_path / "broker/rocketmq/bad.py").write_text("def f(broker):\n    return broker.store.get('t', 0, 0)\n")
    (tmp_path / "broker/kafka").mkdir(parents=True)
    (tmp_path / "broker/kafka/bad.py").write_text("from gms.broker.store.append import x\nimport gms.broker.ha\n"
                                                  "from gms.broker.message_handlers import y\n")
    assert internals_reached(tmp_path) == [
        "broker/rocketmq/bad.py:2: .store", "broker/kafka/bad.py:1: import gms.broker.store.append",
        "broker/kafka/bad.py:2: import gms.broker.ha", "broker/kafka/bad.py:3: import gms.broker.message_handlers"]


# Replication's wire handlers (REPLICA_FETCH, OFFSET_FOR_LEADER_EPOCH) are an adapter of the replication
# service (broker/services/replication.py), which does the leader's work: they import nothing of the
# broker but the services, and reach neither the store nor the replicas' state.
SERVICE_ADAPTERS = ("broker/ha/leader_handlers.py",)
REPLICATION_INTERNALS = BROKER_INTERNALS | {"manager", "partitions", "offsets", "history"}


def adapter_reaches(root: Path = ROOT) -> list[str]:
    found = []
    for name in SERVICE_ADAPTERS:
        path = root / name
        for line, module in _imports(path):
            if module.startswith("gms.broker.") and not module.startswith("gms.broker.services."):
                found.append(f"{name}:{line}: imports {module}")
        found += attributes_used(root, path, REPLICATION_INTERNALS)
    return found


def test_replication_handlers_are_an_adapter_of_the_replication_service():
    assert adapter_reaches() == []


def test_the_check_sees_a_handler_doing_the_leaders_work(tmp_path):
    (tmp_path / "broker/ha").mkdir(parents=True)
    (tmp_path / "broker/ha/leader_handlers.py").write_text(
        "from gms.broker.ha.partition import Role\n\ndef f(self):\n    return self.manager.partitions\n")
    assert adapter_reaches(tmp_path) == ["broker/ha/leader_handlers.py:1: imports gms.broker.ha.partition",
                                         "broker/ha/leader_handlers.py:4: .partitions",
                                         "broker/ha/leader_handlers.py:4: .manager"]
