"""Type stubs for alloctrace._retention (why objects are alive)."""

from typing import Any, Optional

from alloctrace._snapshot import Snapshot, Traceback

class Edge:
    label: str
    referrer_type: str
    referent_type: str
    def __init__(self, label: str, referrer_type: str, referent_type: str) -> None: ...

class ReferrerPath:
    root: str
    root_kind: str
    edges: tuple[Edge, ...]
    def __init__(self, root: str, root_kind: str, edges: tuple[Edge, ...], text: str) -> None: ...
    def __len__(self) -> int: ...

class Retention:
    type: str
    size: int
    retained_size: int
    reachable: bool
    paths: list[ReferrerPath]
    traceback: Optional[Traceback]

class without_user_code:
    def __enter__(self) -> None: ...
    def __exit__(self, *exc_info: object) -> None: ...

def retention(obj: object, limit: int = 3) -> Retention: ...
def referrer_paths(obj: object, limit: int = 3) -> list[ReferrerPath]: ...
def retained_size(obj: object) -> int: ...
def capture_sites(
    sites: list[tuple[str, int]], limit: int = 3, max_lines: int = 5
) -> list[dict[str, Any]]: ...
def _capture(
    snapshot: Snapshot, top: int, baseline: Optional[Snapshot], limit: int
) -> list[dict[str, Any]]: ...
