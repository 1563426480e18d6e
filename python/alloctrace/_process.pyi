from collections.abc import Sequence
from typing import NamedTuple, Optional

class ProcessMemory(NamedTuple):
    rss: int
    anon: int
    file: int
    shmem: int
    peak_rss: int

def get_process_memory() -> ProcessMemory: ...
def _from_native(figures: Optional[Sequence[int]]) -> Optional[ProcessMemory]: ...
