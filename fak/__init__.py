"""fak: an agent-runtime security kernel.

Start with ``from fak import Kernel`` (``fak.kernel.facade``): one object that owns the
model, the policy, the CAS, the audit log, the prefix cache and the sessions.
The top-level package also holds what every layer shares: settings, the server
secret and its derived keys, the shared id types, the error classes and the CLI. Each layer lives
in its own folder (``kernel/``, ``cas/``, ``policy/``, ``audit/``, ``api/``,
``sdk/``) and is imported as ``fak.<layer>``.
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.kernel.session.materialise import WorkingSet
    from fak.settings import Settings

_LAZY = {"Kernel": "fak.kernel.facade", "Settings": "fak.settings", "WorkingSet": "fak.kernel.session.materialise"}
__all__ = ["Kernel", "Settings", "WorkingSet", "__version__"]


def __getattr__(name: str) -> Any:
    """``from fak import Kernel`` without importing torch for ``fak policy check``."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fak' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
