"""fak.policy: YAML policies, normalisation, detectors and the admission gate.

Public API::

    load_policy(path, egress=None) -> Policy      # file, or directory of base + overlays
    load_policy_text(text, source, egress=None) -> Policy
                                           # egress: the deployment's judge allow-lists
                                           # (fak.policy.egress.JudgeEgress; None: no judge)
    gate(policy, tool, data, context=None) -> Verdict   # GateContext(media_type, source, ...)
    PolicyHolder(path).policy / .reload()
    normalize(text) -> str
"""

from fak.policy.errors import Located, PolicyError
from fak.policy.gate import gate, source_host, tool_settings
from fak.policy.holder import PolicyHolder
from fak.policy.normalize import normalize
from fak.policy.policy import Policy, load_policy, load_policy_text
from fak.policy.schema import PolicyDocument, Spec
from fak.policy.verdict import Audited, Exempted, GateContext, Match, Verdict
from fak.types import VerdictKind

__all__ = [
    "Audited", "Exempted", "GateContext", "Located", "Match", "Policy", "PolicyDocument", "PolicyError",
    "PolicyHolder", "Spec", "Verdict", "VerdictKind", "gate", "load_policy", "load_policy_text", "normalize",
    "source_host", "tool_settings",
]
