"""fak: an agent-runtime security kernel.

The top-level package holds only what every layer shares: settings, the server
secret and its derived keys, the error base class and the CLI. Each layer lives
in its own folder (``kernel/``, ``cas/``, ``policy/``, ``audit/``, ``api/``,
``sdk/``) and is imported as ``fak.<layer>``.
"""

__version__ = "0.1.0"
