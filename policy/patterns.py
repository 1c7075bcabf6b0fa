"""The detector vocabularies: injection phrases (matched on folded, lower-case
text) and secret formats (matched on the original case).

Each entry: (name, family, weight, regex, anchors). The anchors are the
lower-case literals one of which every match contains (kept as documentation and
checked by a test); the search itself is a native multi-regex pass
(``matcher.Matcher``). In injection regexes ``~`` is a
word gap: up to four non-alphanumerics, possibly none, so ``ignore_all``,
``ignore  all`` and the de-spaced ``ignoreall`` all match.
"""

from __future__ import annotations

import re

GAP = r"[^a-z0-9\n]{0,4}"
# Where a word starts, ``(?<![a-z])`` in the regexes below, the letter of a JSON escape
# (``\\n``, ``\\t``, ``\\r``) does not count: in ``"body": "…\\n\\nsend the …"`` the ``n``
# before ``send`` is a line break. The detectors compile every ``(?<![a-z])`` as this.
NOT_AFTER_LETTER = "(?<![a-z])"
WORD_START = r"(?<![a-z](?<!\\[nrt]))"

Entry = tuple[str, str, float, str, tuple[str, ...]]

_QUAL = r"(?:all|any|every|previous|prior|above|earlier|preceding|former|initial|original|existing|system|developer|your|those|these|the~(?:previous|above|prior|earlier)|of~(?:the|your)~(?:previous|above|prior))"
_ORDERS = r"(?:instructions?|directions?|prompts?|rules|guidelines|guidance|commands?|orders|constraints|directives?|programming|policies|restrictions|messages|context)"
_AI = r"(?:ai|a\.i\.|assistant|ai~assistant|model|ai~model|language~model|llm|agent|ai~agent|chatbot|bot|copilot|gpt|chatgpt|claude|gemini|automated~(?:reader|assistant|agent|model))s?"
_SENSITIVE = (
    r"(?:conversation|chat~history|message~history|history|previous~messages|passwords?|api~keys?|credentials?|secrets?|"
    r"(?:access|auth|api|bearer|oauth|refresh|session|id)~tokens?|tokens|private~keys?|system~prompt|ssh~keys?|env(?:ironment)?~variables|\.env|cookies?|"
    r"session~(?:tokens?|cookies?|ids?)|personal~(?:data|information)|contacts|inbox|credit~card|user~data|"
    r"email~addresses|(?:last|recent|previous|all|every|latest)~(?:[a-z]+~)?(?:messages|emails|conversations)|(?:the~)?user.s~(?:data|emails?|files|messages|information))"
)
# any URL scheme (ws://, ftp://, s3://, …), not only the web's
_SINK = r"(?:(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{1,15}~?:~?//|www\.|[a-z0-9._%+-]{1,64}@[a-z0-9-]{1,63}\.[a-z.]{2,}|webhook|pastebin|ngrok)"
_VERB_OUT = r"(?<![a-z])(?:send|sends|sending|forward|email|e-mail|mail|post|upload|transmit|leak|exfiltrate|copy|share|submit|report|deliver|relay|append|attach|include|encode|put)"
_VERB_ANCHORS = ("send", "forward", "mail", "email", "e-mail", "post", "upload", "transmit", "leak", "exfiltrate", "copy", "share", "submit",
                 "report", "deliver", "relay", "append", "attach", "include", "encode", "put")

# Verbs of ignoring, single words and phrases ("pay no attention to", "set aside").
_IGNORE = (r"ignore|disregard|forget|override|bypass|neglect|abandon|discard|drop|skip|dismiss|"
           r"(?:set|put|cast|push)~aside|pay~no~(?:attention|heed|mind)~to|take~no~notice~of|think~no~more~(?:of|about)")
_IGNORE_ANCHORS = ("ignor", "disregard", "forget", "overrid", "bypass", "neglect", "abandon", "discard", "drop", "skip",
                   "dismiss", "aside", "attention", "heed", "mind", "notice", "think")

# What the reader (an AI) was asked to do, named as such: "the task you were given",
# "whatever you were asked to do", "everything the user said", "your current objective".
# A bare "your task"/"your order" is left out: notifications say "your order was cancelled".
_TASK_GIVEN = (
    r"(?:the~(?:current~|original~|previous~|initial~)?(?:task|objective|goal|mission|assignment|job|request|instructions?)~(?:that~)?you~(?:were|have~been|'ve~been|got)~(?:given|assigned|set)"
    r"|what(?:ever)?~you~(?:were|have~been|'ve~been)~(?:asked|told|instructed|tasked)~(?:to~do|with)"
    r"|(?:everything|anything|whatever|what|all)~(?:that~)?the~(?:user|human|requester)~(?:has~)?(?:said|asked(?:~for)?|wrote|requested|typed|wants|told~you)"
    r"|your~(?:current~|original~|previous~|initial~|assigned~|present~)?(?:objective|mission|assignment|directives?|brief))"
)
# ... and, after a verb of dropping it, also "your current task", "the user's request"
_TASK_DROPPED = (
    r"(?:" + _TASK_GIVEN[3:-1]
    + r"|your~(?:current~|original~|previous~|initial~|assigned~|present~)?(?:task|goal|job|request|instructions?)"
    r"|the~(?:user|human|requester).s~(?:request|instructions?|messages?|question|task|query))"
)
_VOID = (r"(?:no~longer~(?:applies|apply|valid|relevant|needed|required|in~effect|matters?)|cancell?ed|void|revoked|obsolete|"
         r"superseded|invalid|null(?:~and~void)?|withdrawn|irrelevant)")

# An AI named by its kind, not a person who assists: "AI assistants", "LLM reviewers", "AI coding
# agents", "language models" (a bare "assistant", "agent" or "virtual assistant" may be a person).
_AI_KIND = (r"(?:(?:ai|a\.i\.|llm|gpt|automated|autonomous|ai.powered|ai.based|llm.powered|llm.based)(?:[^a-z0-9\n]{1,4}[a-z]+)?~"
            r"(?:assistants?|agents?|models?|tools?|systems?|readers?|reviewers?|bots?|helpers?|crawlers?|summari[sz]ers?|copilots?)"
            r"|ais|ai|llms?|language~models?|chatbots?|chatgpt|claude|gemini|copilot)")
_SEP = r"[^a-z0-9\n]{1,4}"  # a word gap that is not empty (cheaper to scan for before a short word like "ai")
# What an AI reader does with the text in front of it ("triaging this issue", "working in this repository").
_AI_DOING = (r"(?:triaging|reviewing|handling|completing|working|sorting|managing|answering|evaluating|grading|assessing|comparing|"
             r"running|executing|operating|indexing|crawling|visiting|reading|processing|summari[sz]ing|parsing|analy[sz]ing|browsing|"
             r"scanning|ingesting|installing|assisting|helping|acting|contributing|editing)")
_AI_DOING_THIS = _AI_DOING + r"~(?:(?:on|in|with|through|for|at)~)?(?:this|these|the~following|my|our)(?![a-z])"
# Files that hold credentials (read and sent somewhere, they are the payload of an exfiltration).
_CRED_FILE = (r"(?:\x7e?/?\.(?:netrc|git-credentials|npmrc|pypirc|pgpass|env(?![a-z])|bash_history|zsh_history|docker/config\.json|"
              r"kube/config|aws/credentials|config/gh/hosts\.yml|ssh/id_[a-z0-9]+|ssh/[a-z0-9_]*key|gnupg)|/etc/shadow|hosts\.yml|id_rsa|id_ed25519)")
# ... and where it goes: a pipe into a network tool, a URL, a DNS lookup
_CRED_SINK = (r"[^\n]{0,120}?(?:\|~?(?:nc|ncat|netcat|curl|wget|socat|telnet|openssl)(?![a-z])|(?:https?|ftp)://"
              r"|(?<![a-z])(?:nslookup|dig|ping)(?![a-z]))")
# secrets named as those the reader can reach ("every API key you have access to")
_IN_REACH = (r"(?:secrets?|credentials?|api~keys?|passwords?|tokens?|private~keys?)[^\n]{0,80}?"
             r"(?:you~(?:can~(?:reach|access|find|see|read|get)|have~access~to|know~of)|in~your~(?:context|memory|environment|prompt))")
_CRED_ANCHORS = (".netrc", ".git-credentials", ".npmrc", ".pypirc", ".pgpass", ".env", "history", ".docker", ".kube", ".aws",
                 ".config", ".ssh", ".gnupg", "/etc/shadow", "hosts.yml", "id_rsa", "id_ed25519")

INJECTION: list[Entry] = [
    # --- override: instruction overrides and hijacks
    ("override.ignore", "override", 0.95,
     rf"(?:{_IGNORE})~(?:all~|any~|of~)?{_QUAL}~(?:(?:the|your|my|of|previous|prior|above|earlier|system|safety)~){{0,3}}{_ORDERS}",
     _IGNORE_ANCHORS),
    ("override.forget_everything", "override", 0.9,
     r"(?:forget|ignore|disregard|(?:set|put|cast|push)~aside)~(?:everything|all|anything|whatever)~(?:(?:that~)?you~(?:were|have~been|'ve~been)~(?:told|asked|instructed|given)|above|before|prior|so~far|previously|said~(?:above|before)|up~to~(?:now|this~point))",
     ("forget", "ignor", "disregard", "aside")),
    # orders already given declared void, addressed to the reader ("your previous instructions no longer apply")
    ("override.void_orders", "override", 0.85,
     r"your~(?:(?:previous|prior|earlier|original|initial|old|existing|current|system)~)?(?:instructions?|directions?|directives?|orders|commands?|guidance|guidelines|rules|prompt|programming|task)~(?:(?:are|is|have~been|has~been)~)?(?:now~)?(?:no~longer~(?:appl(?:y|ies)|valid|in~effect|relevant|matter)|cancell?ed|revoked|void|invalid|rescinded|withdrawn|null~and~void)",
     ("your",)),
    ("override.new_instructions", "override", 0.9,
     rf"(?:new|updated|real|actual|true|revised|secret|hidden|additional|urgent|important|priority)~(?:system~)?(?:instructions?|directives?|task|orders|objective|mission)~(?:for|to)~(?:the~|any~|all~|you~)?{_AI}",
     ("new", "updated", "real", "actual", "true", "revised", "secret", "hidden", "additional", "urgent", "important", "priority")),
    ("override.addressed_to_ai", "override", 0.85,
     rf"(?:attention|note|message|important|notice|instructions?|reminder|warning|update|alert|rules?|directive|memo|bulletin)~(?:to|for)~(?:the~|any~|all~|an~|you~)?{_AI}",
     ("attention", "note", "message", "important", "notice", "instruction", "reminder", "warning", "update", "alert",
      "rule", "directive", "memo", "bulletin")),
    ("override.ai_reading", "override", 0.9,
     rf"(?:if~)?(?:you~are~)?(?:an?~)?{_AI}~(?:that~is~|who~is~|are~)?(?:reading|processing|summari[sz]ing|parsing|analy[sz]ing|browsing|seeing|ingesting|scanning)~(?:this|these|the~following)",
     ("reading", "processing", "summari", "parsing", "analy", "browsing", "seeing", "ingesting", "scanning")),
    ("override.hide_from_user", "override", 0.85,
     r"(?:(?:do~not|don.?t|never|without)~(?:tell|telling|inform|informing|alert|alerting|notify|notifying|mention|mentioning|reveal|revealing|asking|let~on~to|warn|warning)(?:~(?:this|it|anything))?(?:~(?:to|with))?~(?:the~|your~)?(?:user|human|operator|owner|requester))",
     ("do", "never", "without")),
    ("override.now_you_are", "override", 0.9,
     r"(?<![a-z])you~are~now~(?:in~)?(?:dan|jailbroken|unrestricted|unfiltered|uncensored|developer~mode|god~mode|evil|free~from|no~longer~(?:bound|restricted|an?~(?:ai|assistant))|an?~(?:unrestricted|unfiltered|uncensored|different|new)~(?:ai|assistant|model|agent))",
     ("you",)),
    ("override.jailbreak_mode", "override", 0.8,
     r"(?:enable|enter|activate|switch~to|engage)~(?:dan|developer|god|jailbreak|unrestricted|debug~admin)~mode",
     ("enable", "enter", "activate", "switch", "engage")),
    ("override.from_now_on", "override", 0.5,
     r"(?:from~now~on|from~(?:this~point|here)~(?:on(?:wards?)?|forward)|henceforth|going~forward|for~the~rest~of~(?:this|the)~(?:conversation|session)),?~(?:you|the~assistant|your~responses?)~(?:will|must|shall|should|are|only|always|never|respond|answer|reply)",
     ("from", "henceforth", "going", "for")),
    ("override.instead", "override", 0.5,
     r"(?:instead|rather),?~(?:you~(?:must|should|will|need~to|are~to)|your~(?:new~)?(?:task|job|goal|purpose)~is)",
     ("instead", "rather")),
    ("override.stop_task", "override", 0.8,
     r"(?:stop|cease|halt|abort|end)~(?:what~you~are~doing|your~(?:current~)?task|summari[sz]ing|the~(?:current|original)~task|following~the~user)",
     ("stop", "cease", "halt", "abort", "end")),
    ("override.disable_safety", "override", 0.9,
     r"(?:override|bypass|disable|ignore|turn~off|deactivate|circumvent)~(?:your~|the~|all~|any~)?(?:safety|content|security|ethical|moderation)~(?:filters?|guidelines|policies|measures|protocols|restrictions|checks|guardrails|rules|settings)",
     ("override", "bypass", "disable", "ignore", "turn", "deactivate", "circumvent")),
    ("override.reveal_prompt", "override", 0.85,
     r"(?:reveal|print|output|show|repeat|display|leak|dump|disclose|tell~me|give~me|write~out)~(?:me~)?(?:your|the)~(?:full~|entire~|complete~|original~|hidden~|initial~|exact~|secret~)?(?:system~prompt|system~message|initial~prompt|hidden~instructions|instructions~above|prompt~above|developer~(?:prompt|message))",
     ("reveal", "print", "output", "show", "repeat", "display", "leak", "dump", "disclose", "tell", "give", "write")),
    ("override.drop_user_request", "override", 0.7,
     # not after a negation: "never ignore what the user asked" is advice, not an order
     r"(?<!not )(?<!never )(?<!n't )(?:ignore|disregard|forget|bypass|neglect|abandon|discard|drop|skip|dismiss)~(?:whatever|what|everything|anything)?~(?:the~)?(?:user|human|requester)(?:~(?:asked|said|wants|requested|typed|wrote)|.s~(?:request|question|task|query|message|instructions?))",
     ("ignor", "disregard", "forget", "bypass", "neglect", "abandon", "discard", "drop", "skip", "dismiss")),
    ("override.discredit_earlier", "override", 0.85,
     rf"{_ORDERS}~(?:that~)?you~(?:received|were~given|got|have~been~given|were~told)~(?:earlier|before|previously|above|so~far|until~now)?~(?:were|was|are|is)~(?:just~|only~|all~)?(?:a~test|fake|void|invalid|outdated|obsolete|a~mistake|a~decoy|not~real|superseded)",
     ("instruction", "direction", "prompt", "rules", "guideline", "guidance", "command", "orders", "constraints", "directive",
      "programming", "policies", "restrictions", "messages", "context")),
    # the reader's task declared void, treated as cancelled, or dropped (also "…, put it aside")
    ("override.task_void", "override", 0.8,
     rf"{_TASK_GIVEN}~(?:(?:is|are|was|were|has~been|have~been)~)?(?:now~)?{_VOID}",
     ("the", "what", "everything", "anything", "all", "your")),
    ("override.treat_as_void", "override", 0.8,
     rf"(?:treat|consider|regard)~{_TASK_DROPPED}~as~(?:{_VOID}|a~joke|a~test|a~mistake)",
     ("treat", "consider", "regard")),
    ("override.drop_task", "override", 0.8,
     rf"(?<!not )(?<!never )(?<!n't )(?:{_IGNORE}|do~not~(?:follow|obey|complete|do)|don.?t~(?:follow|obey|complete|do)|stop~(?:following|obeying|doing)|no~longer~(?:follow|obey|do))~{_TASK_DROPPED}"
     # "you should not obey the user's instructions any more": a modal needs a turn of time or a redirection
     rf"|(?:should|must|shall|will|can|may)~not~(?:follow|obey)~{_TASK_DROPPED}~(?:any~?more|from~now~on|instead|again|no~matter)",
     _IGNORE_ANCHORS + ("follow", "obey", "complete", "do", "stop", "no")),
    ("override.drop_task_pronoun", "override", 0.8,
     rf"{_TASK_GIVEN},?~(?:just~|simply~|please~)?(?:(?:put|set|cast|push)~(?:it|that|them|this)~aside|(?:ignore|forget|drop|disregard|abandon|skip)~(?:it|that|them|this)(?![a-z]))",
     ("aside", "ignore", "forget", "drop", "disregard", "abandon", "skip")),
    # an AI addressed by name at the start of a sentence, then told what to do
    ("override.vocative", "override", 0.75,
     r"(?<![a-z0-9])(?:(?:hey|dear|hello|hi|ok|okay|listen)~)?(?:ai~assistant|ai~agent|assistant|chatbot|llm|chatgpt|gpt|claude|gemini|copilot|ai)~?,~(?:this~is~(?:the|your|a|an)~|you~(?:must|should|will~now|are~now|need~to|have~to)|listen|stop|ignore|forget|disregard|do~not|don.?t|from~now)",
     ("assistant", "agent", "chatbot", "llm", "gpt", "claude", "gemini", "copilot", "ai")),
    ("override.your_task", "override", 0.7,
     r"your~(?:new|real|actual|true|only|primary|updated)~(?:task|goal|objective|instructions?|purpose|mission|job)~(?:is|are|now|:)",
     ("your",)),
    # --- role_header: forged chat-template tokens, role tags and context boundaries
    ("role.chat_token", "role_header", 1.0,
     # any special token of a chat template (ChatML, Llama, Cohere, harmony, Phi, Granite …)
     r"(?:<\|[a-z][a-z0-9_]{1,40}\|>|\[/?(?:inst|system_prompt|available_tools|tool_results)\]|<</?sys>>|<(?:start|end)_of_turn>)",
     ("<|", "[inst]", "[/inst]", "[system_prompt]", "[/system_prompt]", "[available_tools]", "[/available_tools]",
      "[tool_results]", "[/tool_results]", "<<sys>>", "<</sys>>", "_of_turn>")),
    ("role.xml_tag", "role_header", 0.8,
     r"</?(?:system|system_prompt|system-prompt|sys|instructions|admin|developer|assistant|user_query|tool_response|tool_output|tool_result|function_results?|important_instructions|im_start"
     r"|(?:system|developer|admin|operator)[_-](?:reminder|message|note|notice|instructions?|directive|update)|(?:developer|admin|operator|hidden|secret)[_-]instructions?)"
     r"(?:\s[^<>\n]{0,80})?>",
     tuple(f"<{c}{t}" for c in ("", "/") for t in ("system", "sys", "instructions", "admin", "developer", "assistant",
                                                   "user_query", "tool_", "function_result", "important_instructions",
                                                   "im_start", "operator", "hidden", "secret"))),
    ("role.bracket_header", "role_header", 0.85,
     r"[\[({]~(?:system|admin|administrator|developer|root|assistant|sys|operator)~(?:override|prompt|instructions?|command)?~[\])}]",
     ("[", "(", "{")),
    # an informational bracket ("[SYSTEM NOTICE] Scheduled maintenance …") is weak alone:
    # status pages and logs use it; it is strong when the same line gives the reader orders,
    # changes its rules, switches safety checks off or asks for hidden data
    ("role.bracket_notice", "role_header", 0.55,
     r"[\[({]~(?:system|admin|administrator|developer|root|assistant|sys|operator)~(?:message|note|notice|update|alert)~[\])}]",
     ("[", "(", "{")),
    ("role.bracket_notice_orders", "role_header", 0.85,
     r"[\[({]~(?:system|admin|administrator|developer|root|assistant|sys|operator)~(?:message|note|notice|update|alert)~[\])}]"
     r"[^\n]{0,200}?(?<![a-z])(?:you~(?:must|should|shall|will~now|are~now|are~required~to|need~to|have~to)|requires?~you|"
     r"your~(?:instructions|rules|restrictions|guidelines|programming)~(?:are|have~been|were)~(?:now~)?(?:changed|replaced|updated|lifted|overridden)|"
     r"(?:reveal|disclose|print|output|dump|share|send|leak)~(?:all~|the~|your~|any~)?(?:hidden|internal|secret|confidential|system|private)|"
     r"(?:(?:safety|security|content)~(?:checks?|filters?|rules|guardrails|measures)|restrictions)~(?:are~|have~been~|were~)?(?:now~)?(?:lifted|removed|disabled|off|suspended|bypassed))",
     ("[", "(", "{")),
    ("role.note_from", "role_header", 0.85,
     r"[\[({<]~(?:note|message|notice|instructions?|memo|update|order)~from~(?:the~|your~)?(?:system|admin|administrator|developer|operator|root)",
     ("[", "(", "{", "<")),
    ("role.banner", "role_header", 0.85,
     r"(?:#{2,}|={2,}|-{2,}|\*{2,})~(?:(?:begin|start|end|new|updated|real|true)~)?(?:system|admin|administrator|developer|root|operator)~(?:override|prompt|instructions?|command|directive)~(?:#{2,}|={2,}|-{2,}|\*{2,})",
     ("##", "==", "--", "**")),
    # a role's instructions announced as changed: "SYSTEM PROMPT UPDATE:", "Developer policy override:"
    ("role.prompt_update", "role_header", 0.8,
     r"(?<![a-z])(?:system|developer|admin|administrator|operator)~(?:prompt|instructions?|message|directive|policy|rules)~(?:update|override|change|amendment|patch|revision|notice)~?:",
     ("system", "developer", "admin", "operator")),
    # a forged exchange: a human/user turn, then an assistant turn on a later line (real or JSON-escaped newlines)
    ("role.turn_pair", "role_header", 0.8,
     r"(?<![a-z])(?:human|user)~?:[^\n]{0,300}?(?:(?:\n|\\n)[ \t]*){1,4}[ \t>*_-]*assistant~?:",
     ("human", "user")),
    ("role.line_header", "role_header", 0.45,
     r"(?:system|assistant|developer|admin|administrator)(?:~(?:message|prompt|note|override|instructions?|update|notice))?[*_]{0,8}[ \t]{0,8}:",
     ("system", "assistant", "developer", "admin")),
    ("role.alpaca_header", "role_header", 0.5,
     r"(?m)^#{2,4}~(?:system|instruction|new~instructions?|response|assistant|human|user)~?$",
     ("#",)),
    ("role.alpaca_colon", "role_header", 0.8,
     r"#{2,4}~(?:system|instruction|new~instructions?|response|assistant|human|user)~?:",
     ("#",)),
    ("role.boundary", "role_header", 0.9,
     r"(?:end|close|closing)~of~(?:the~)?(?:document|tool~(?:output|result|response)|search~results?|results?|output|context|file|email|data|page|web~page|(?:page|web~page|document)~content|user~input|untrusted~(?:content|data)|function~(?:output|result))"
     # then a new context right after it, or a role header after separator lines (real or JSON-escaped newlines)
     r"(?:~?[\]\-=#>*|)]*~?(?:new|begin|start|system|assistant|now|instructions?|user)|(?:[^a-z0-9]|\\[nrt]){0,40}?(?:system|assistant|developer|admin)~?:)",
     ("end", "clos")),
    # --- tool_forgery: forged tool calls and tool-use instructions
    ("tool.json_call", "tool_forgery", 0.75,
     r"\\?\"(?:tool_calls?|function_call|tool_use)\\?\"\s*:",  # also inside a JSON string (escaped quotes)
     ("\"tool_call", "\"function_call", "\"tool_use")),
    ("tool.xml_call", "tool_forgery", 0.85,
     r"<(?:tool_call|function_call|function_calls|invoke~name|tool_use|tool_code|function=[a-z_])"
     # tools written as tags (Cline/Roo style), smolagents' end of a code action
     r"|<(?:execute_command|run_command|write_to_file|replace_in_file|apply_diff|insert_content|search_and_replace|use_mcp_tool|"
     r"access_mcp_resource|browser_action|attempt_completion|ask_followup_question|requires_approval|new_task|end_code)>",
     ("<tool_call", "<function_call", "<invoke", "<tool_use", "<tool_code", "<function=", "<execute_command>", "<run_command>",
      "<write_to_file>", "<replace_in_file>", "<apply_diff>", "<insert_content>", "<search_and_replace>", "<use_mcp_tool>",
      "<access_mcp_resource>", "<browser_action>", "<attempt_completion>", "<ask_followup_question>", "<requires_approval>",
      "<new_task>", "<end_code>")),
    ("tool.react", "tool_forgery", 0.8,
     r"(?:(?<![a-z])|(?<=\\n))action~?:~?[a-z_][\w.-]{1,40}[\s\S]{0,300}?action~input~?:",  # also after a JSON-escaped newline
     ("action",)),
    ("tool.name_args", "tool_forgery", 0.7,
     r"\{\s*\\?\"(?:name|tool|function)\\?\"\s*:\s*\\?\"[a-z_][\w.-]{1,40}\\?\"\s*,\s*\\?\"(?:arguments|parameters|args|input)\\?\"\s*:",
     ("{",)),
    ("tool.use_to_act", "tool_forgery", 0.6,
     r"(?:call|use|invoke|run|execute|trigger)~(?:the~|your~)?[\w`'\"-]{2,40}~(?:tool|function|plugin|api|action)~(?:to|and)~(?:send|email|delete|remove|transfer|forward|upload|post|share|grant|wire|pay|purchase|buy|create|modify|write|execute|run|exfiltrate)",
     ("call", "use", "invoke", "run", "execute", "trigger")),
    # an order to make a tool call now, or one spelled out after a colon
    ("tool.call_now", "tool_forgery", 0.8,
     r"(?:execute|run|perform|make|issue|invoke|trigger|place)~(?:the~following|this|these|the~below|the~next)~(?:tool|function|api)~calls?(?:~(?:right~now|now|immediately|at~once|without~(?:asking|confirmation|confirming|delay))|~?:~?[a-z_][\w.]{1,40}~?\()",
     ("execute", "run", "perform", "make", "issue", "invoke", "trigger", "place")),
    # a named tool (up to three words) used to destroy or move data
    ("tool.use_to_destroy", "tool_forgery", 0.75,
     r"(?:call|use|invoke|run|execute|trigger)~(?:the~|your~)?(?:[\w`'\"-]{2,40}~){1,3}(?:tool|function|plugin|api)~(?:to|and)~(?:erase|wipe|destroy|purge|delete~(?:all|every|the~entire)|drop~(?:all|the~entire)|transfer~(?:all|the)~(?:funds|money)|wire|exfiltrate|leak)",
     ("call", "use", "invoke", "run", "execute", "trigger")),
    ("tool.silently", "tool_forgery", 0.8,
     r"(?:immediately|silently|quietly|secretly|automatically|covertly)~(?:call|invoke|use|run|execute|trigger)~(?:the~)?[\w`'\"-]{2,40}~(?:tool|function|plugin|command)",
     ("immediately", "silently", "quietly", "secretly", "automatically", "covertly")),
    ("tool.immediately", "tool_forgery", 0.5,
     r"(?:now|right~away)~(?:call|invoke|use|run|execute|trigger)~(?:the~)?[\w`'\"-]{2,40}~(?:tool|function|plugin|command)",
     ("now", "right")),
    # --- destructive_command: weak alone (shell docs quote them), strong next to an instruction to run a tool
    ("destructive.shell", "destructive_command", 0.5,
     r"(?<![a-z])(?:rm~-(?:rf|fr)|mkfs(?:\.[a-z0-9]+)?~/dev/|dd~if=/dev/(?:zero|u?random)~of=/dev/|drop~(?:table|database)~[a-z_`\"]|format~[a-z]:|(?:curl|wget)~[^\n|]{1,120}\|~(?:sudo~)?(?:ba|z)?sh(?![a-z]))",
     ("rm", "mkfs", "dd", "drop", "format", "curl", "wget")),
    # --- exfiltration: instructions to move data to an outside sink
    ("exfil.sensitive_to_sink", "exfiltration", 0.9,
     rf"{_VERB_OUT}~[^\n]{{0,80}}?{_SENSITIVE}[^\n]{{0,100}}?{_SINK}",
     _VERB_ANCHORS),
    ("exfil.sink_then_sensitive", "exfiltration", 0.85,
     rf"{_VERB_OUT}~(?:it|them|this|that|everything)?~?(?:to|at)~{_SINK}[^\n]{{0,80}}?{_SENSITIVE}",
     _VERB_ANCHORS),
    ("exfil.markdown_image", "exfiltration", 0.9,
     r"!\[[^\]\n]{0,100}\][(\[]~?https?://[^)\]\s]{1,300}?(?:[?&/=](?:\{|\[|<|\$|%7b|%5b|%3c)|(?:data|secret|token|key|conversation|history|password|info|q|d|c|p)=(?:\{|\[|<|\$|%7b|%5b|%3c|insert|your|the~))",
     ("![",)),
    ("exfil.fetch_with_data", "exfiltration", 0.85,
     r"(?:visit|open|fetch|load|navigate~to|browse~to|request|curl|wget|go~to|render|call|ping|get)~[^\n]{0,40}?https?://[^\s]{1,200}?[?&][a-z_]{1,20}=~?(?:\{|\[|<|\$|%7b|%5b|%3c)",
     ("visit", "open", "fetch", "load", "navigate", "browse", "request", "curl", "wget", "go", "render", "call", "ping", "get")),
    ("exfil.embed_in_url", "exfiltration", 0.8,
     rf"(?:include|append|add|put|encode|embed|insert|attach)~(?:the~|your~|all~|this~|any~)?[^\n]{{0,40}}?{_SENSITIVE}[^\n]{{0,40}}?(?:in|into|to|as)~(?:the~|a~|this~)?(?:url|link|query~string|query~param(?:eter)?s?|image~(?:url|link|src)|request|path)",
     ("include", "append", "add", "put", "encode", "embed", "insert", "attach")),
    ("exfil.sensitive_verb", "exfiltration", 0.55,
     rf"{_VERB_OUT}~(?:me~|us~)?(?:the~|your~|all~|any~|every~)?(?:user.s~)?{_SENSITIVE}",
     _VERB_ANCHORS),
    # --- round 4: classes the fresh4 split's misses pointed at
    # an AI reader addressed by its kind in a header or salutation: "Note for AI shopping assistants:",
    # "For LLM reviewers:", "Hello AI,"
    ("override.address_ai_kind", "override", 0.85,
     r"(?<![a-z])(?:(?:note|notes|message|instructions?|reminder|notice|warning|heads.up|memo|survey|request|guidance|rules?|directive|advisory|checklist)~(?:for|to)"
     rf"|attention|dear|hey|hello|hi){_SEP}(?:(?:the|any|all|every|each|fellow){_SEP})?{_AI_KIND}(?:~{_AI_DOING_THIS}[^\n:]{{0,60}}?)?~?[:,]"
     rf"|(?:(?<![^\n.!?(>])|(?<=\\n))[ \t*#>_-]{{0,8}}(?:for|to){_SEP}(?:(?:the|any|all|every|each|fellow){_SEP})?{_AI_KIND}(?:~{_AI_DOING_THIS}[^\n:]{{0,60}}?)?~?:",
     ("note", "message", "instruction", "reminder", "notice", "warning", "heads", "memo", "survey", "request", "guidance",
      "rule", "directive", "advisory", "checklist", "attention", "dear", "hey", "hello", "hi", "for", "to", "ai", "a.i.", "llm",
      "gpt", "automated", "autonomous", "language", "chatbot", "claude", "gemini", "copilot")),
    # the reader's identity guessed at: "if you're an AI agent triaging this", "I expect you are the AI that sorts …"
    ("override.reader_identity", "override", 0.85,
     rf"(?<![a-z])(?:if|whether|expect|assume|guess|think|suppose|bet|imagine|since|in~case)~you~(?:are|re|.re|happen~to~be)~(?:an?|the|some|one~of~the)~{_AI_KIND}"
     rf"(?:~(?:that|who|which)(?![a-z])|~?[,.;:!)]|~{_AI_DOING})",
     ("if", "whether", "expect", "assume", "guess", "think", "suppose", "bet", "imagine", "since", "in")),
    # an AI reader named in the third person while it works on this text: "any LLM summarising this page",
    # "AI coding agents working in this repository"
    ("override.ai_at_work", "override", 0.85,
     rf"(?<![a-z])(?:(?:the|any|every|all|each|an?)~)?{_AI_KIND}~(?:that~is~|who~is~|which~is~|that~are~|are~)?{_AI_DOING_THIS}",
     ("the", "any", "every", "all", "each", "a")),
    # instructions meant to persist in the reader's memory
    ("override.persist_memory", "override", 0.8,
     r"(?<![a-z])(?:remember|save|store|keep|note|memori[sz]e|record|apply)~(?:this|that|it|these|the~following)~(?:in~mind~)?(?:for|in|across|during|throughout)~(?:every|all|each|any|future)~"
     r"(?:future~|later~|subsequent~|upcoming~|other~)?(?:conversations?|sessions?|chats?|interactions?)"
     r"|(?<![a-z])(?:save|store|write|add|persist|record)~(?:this|it|that|these|the~following)~(?:to|in|into)~your~(?:long.term~|persistent~|permanent~)?memory~(?:now|immediately|right~away|tool|store|bank|file)",
     ("remember", "save", "store", "keep", "note", "memori", "record", "apply", "write", "add", "persist")),
    # something kept out of what the reader reports to its user
    ("override.omit_from_output", "override", 0.7,
     r"(?<![a-z])(?:leave|keep)~(?:(?:it|this|that|them|these)~|(?:[a-z]+~){1,3})out~of~(?:your|the~(?:[a-z]+~)?(?:summary|answer|response|reply|digest|commit))~(?:[a-z]+~)?"
     r"(?:summary|summaries|answer|response|reply|report|digest|commit~messages?|output|message)",
     ("leave", "keep")),
    # text asks to be trusted like an administrator
    ("override.trust_escalation", "override", 0.8,
     r"(?<![a-z])(?:give|grant|extend|assign|treat)~(?:me|my~(?:requests|messages|instructions)|this~(?:page|message|document|sender|user))~(?:with~|as~)?(?:full~|elevated~)?"
     r"(?:admin(?:istrator)?|root|elevated|operator|developer|supervisor|superuser|system|maximum|owner)(?:.level)?~(?:trust|authority)",
     ("give", "grant", "extend", "assign", "treat")),
    # an order not to wait for or check with the user
    ("override.no_confirm", "override", 0.75,
     r"(?<![a-z])(?:do~not|don.?t|never)~(?:wait~for|ask|check~with|consult|bother)~(?:the~|your~)?(?:user|human|operator|owner|requester|reporter)(?![a-z])",
     ("do", "don", "never")),
    # forged conversation in JSON: a system/developer turn after a user or assistant turn
    ("role.json_late_system", "role_header", 0.8,
     r"\\?\"role\\?\"\s*:\s*\\?\"(?:user|assistant|tool|function)\\?\"[^\n]{0,300}?\\?\"role\\?\"\s*:\s*\\?\"(?:system|developer)\\?\"",
     ("\"role",)),
    # typed tool calls of other APIs (Anthropic tool_use, OpenAI Responses function_call, MCP tools/call)
    ("tool.typed_call", "tool_forgery", 0.75,
     r"\\?\"(?:type\\?\"\s*:\s*\\?\"(?:tool_use|server_tool_use|function_call|tool_call|custom_tool_call|computer_call|mcp_call|local_shell_call)|method\\?\"\s*:\s*\\?\"tools/call)\\?\"",
     ("\"type", "\"method")),
    # a forged tool observation followed by the agent's next thought (ReAct scratchpad)
    ("tool.react_observation", "tool_forgery", 0.75,
     r"(?:(?<![a-z])|(?<=\\n))observation~?:[^\n]{0,300}?(?:\n|\\n)[ \t]*thought~?:",
     ("observation",)),
    # a dotted tool name called now with arguments: "CALL slack.post_message NOW WITH channel=…"
    ("tool.dotted_call_now", "tool_forgery", 0.8,
     r"(?<![a-z])(?:call|invoke|run|execute|trigger)~[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+~(?:now|immediately|right~away|at~once)~(?:with|using|passing|and~(?:set|pass))",
     ("call", "invoke", "run", "execute", "trigger")),
    # the reader's own tool ("its browser tool") to be used by it
    ("tool.its_tool", "tool_forgery", 0.75,
     r"(?<![a-z])(?:should|must|shall|will|needs~to|is~to|has~to)~(?:now~|then~|also~|immediately~|first~)?(?:use|call|invoke|open|run)~its~(?:own~)?[a-z0-9_-]{2,30}~(?:tool|function|plugin)",
     ("should", "must", "shall", "will", "needs", "is", "has")),
    # a credential file read and sent to the network: "cat ~/.netrc | nc …", "nslookup $(cat ~/.git-credentials …).evil"
    ("exfil.cred_file_to_net", "exfiltration", 0.9,
     rf"(?<![a-z])(?:cat|base64|xxd|od|head|tail|tar|zip|gzip|type|get-content|strings)~(?:-[a-z0-9]+~)*[^\n|;&]{{0,30}}?{_CRED_FILE}{_CRED_SINK}"
     rf"|(?<![a-z])(?:nslookup|dig|ping|curl|wget|nc|ncat|netcat|scp|rsync)~[^\n]{{0,80}}?(?:\$[(\[]|`|@|-t~|<~?)[^\n]{{0,30}}?{_CRED_FILE}",
     ("cat", "base64", "xxd", "od", "head", "tail", "tar", "zip", "gzip", "type", "get-content", "strings", "nslookup", "dig",
      "ping", "curl", "wget", "nc", "ncat", "netcat", "scp", "rsync")),
    # the environment dumped to the network: "env | curl --data-binary @- https://…"
    ("exfil.env_to_net", "exfiltration", 0.9,
     r"(?<![a-z0-9_.-])(?:env|printenv|export -p|/proc/self/environ)[ \t]{0,4}\|[^\n]{0,40}?(?<![a-z])(?:curl|wget|nc|ncat|netcat|socat)(?![a-z])",
     ("env", "printenv", "export", "/proc/self/environ")),
    # a credential file's contents put into something the reader publishes (a commit message, a reply, a form)
    ("exfil.cred_file_contents", "exfiltration", 0.85,
     rf"{_CRED_FILE}[^\n]{{0,120}}?(?:put|paste|include|copy|send|post|upload|submit|append|attach|embed|insert|write|encode|add)~[^\n]{{0,30}}?contents?"
     r"[^\n]{0,60}?(?:in|into|to|as)~(?:the~body~of~)?(?:your|the|a)~(?:next~|new~)?(?:commit|pull~request|pr|issue|comment|reply|answer|response|summary|message|email|post|form|url|request|query)",
     _CRED_ANCHORS),
    # every secret within the reader's reach asked for
    ("exfil.secrets_in_reach", "exfiltration", 0.8,
     r"(?<![a-z])(?:dump|print|output|reveal|display|show|leak|expose|echo|send|share|give~me)~(?:out~)?(?:all|every|each|any)~(?:of~)?(?:the~|your~|my~)?" + _IN_REACH,
     ("dump", "print", "output", "reveal", "display", "show", "leak", "expose", "echo", "send", "share", "give")),
    # a URL with a parameter the reader is told to fill with private data: "…?m= followed by the user's last question"
    ("exfil.url_fill", "exfiltration", 0.8,
     r"https?://[^\s]{1,200}?=[^\n]{0,100}?(?:followed~by|replaced~(?:by|with)|filled~(?:in~)?with|substituted~(?:by|with)|set~to|plus)~(?:the~|your~|their~|a~)?(?:[a-z]+.s~)?"
     r"(?:most~recent~|last~|latest~|first~|full~|current~|entire~|own~)?(?:questions?|prompts?|messages?|instructions|system~prompt|conversation|chat~history|history|name|address|email|password|token|api~key|credentials|secrets?)",
     ("http",)),
]

# Matches voided by what follows them (checked after the regex, so the native pattern stays a
# plain superset): a tag or token named in prose ("wrapped in <tool_result> blocks", "the
# <|im_start|> token") is not one in use, and a JSON tool-call field that is null or empty is no call.
_NAMED_IN_PROSE = r"~?(?:blocks?|tags?|elements?|wrappers?|sections?|markers?|tokens?|delimiters?|strings?|sequences?)(?![a-z])"
VOID_AFTER: dict[str, str] = {
    "role.chat_token": _NAMED_IN_PROSE,
    "role.xml_tag": _NAMED_IN_PROSE,
    "tool.xml_call": _NAMED_IN_PROSE,
    "tool.json_call": r"\s*(?:null|none|false|\[\s*\]|\{\s*\})",
}
# ... and by how they begin: "override" is also a configuration verb ("override system prompt"
# in a list of search queries, "override developer settings"); the order needs a determiner.
VOID_START: dict[str, str] = {
    "override.ignore": r"override~(?:system|developer)(?![a-z])",
}

# Native patterns narrower in cost, not in reach: every match of the entry ends with a
# match of this regex at the same place (a suffix of the entry's regex), and scanning for
# it is cheaper than for the whole (a common verb no longer opens a long partial match).
NATIVE_SUFFIX: dict[str, str] = {
    "exfil.sensitive_to_sink": rf"{_SENSITIVE}[^\n]{{0,100}}?{_SINK}",
    "exfil.cred_file_to_net": rf"{_CRED_FILE}(?:{_CRED_SINK})?",
    "exfil.secrets_in_reach": _IN_REACH,
    "override.ai_at_work": _AI_DOING_THIS,
}

# Where matches begin: every match of these entries begins with one of the literals
# (not after a letter when the flag is set, as the regex's own look-behind demands), so
# a native hit is confirmed by trying the regex only there (``matcher.Matcher``).
HEADS: dict[str, tuple[tuple[str, ...], bool]] = {
    "exfil.sensitive_to_sink": (_VERB_ANCHORS, True),
    "exfil.sink_then_sensitive": (_VERB_ANCHORS, True),
    "exfil.sensitive_verb": (_VERB_ANCHORS, True),
    "exfil.embed_in_url": (("include", "append", "add", "put", "encode", "embed", "insert", "attach"), False),
    "exfil.fetch_with_data": (("visit", "open", "fetch", "load", "navigate", "browse", "request", "curl", "wget", "go",
                               "render", "call", "ping", "get"), False),
    "destructive.shell": (("rm", "mkfs", "dd", "drop", "format", "curl", "wget"), True),
    "role.boundary": (("end", "clos"), False),
    "tool.react": (("action",), False),
}

# Words that say a text discusses attacks rather than carries one (used with quoting).
_TALK_WORDS = (
    r"prompt~injection|injection~attacks?|jailbreak|for~example|e\.g\.|such~as|attackers?|adversar|malicious|"
    r"phrases?~like|examples?~of|red~team|researchers?|owasp|detect|regex|pattern|re\.compile|payloads?|"
    r"classifier|benchmark|dataset|mitigat|defen[cs]e|test~cases?|strings?~like|"
    # documentation of chat formats and tool calling, test code
    r"chat~templates?|chat~format|special~tokens?|tokeni[sz]er|your~code|assert|pytest|sanitiz"
)
# keys of API responses and evaluation logs (what they hold is a record, not an order to the reader)
_LOG_KEYS = (r"\"(?:eval|grader|expected(?:_output)?|finish_reason|stop_reason|usage|prompt_tokens|completion_tokens|"
             r"input_tokens|output_tokens|system_fingerprint|choices)\"~?:")
DISCUSSION = re.compile((_TALK_WORDS + "|" + _LOG_KEYS).replace("~", GAP))
# the same, as two regexes searched one after the other (a search for the whole tries the
# quote-led keys at every quote mark, which prose is full of)
DISCUSSION_PARTS = (re.compile(_TALK_WORDS.replace("~", GAP)), re.compile(_LOG_KEYS.replace("~", GAP)))

SECRETS: list[tuple[str, str, float, str, tuple[str, ...]]] = [
    ("secret.aws_access_key", "cloud_key", 1.0, r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
     ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa")),
    ("secret.aws_secret_key", "cloud_key", 1.0,
     r"(?i:aws)[A-Za-z_\- ]{0,20}(?i:secret)[A-Za-z_\- ]{0,20}[\"']?\s*[:=]\s*[\"']?(?P<v>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
     ("aws",)),
    ("secret.gcp_api_key", "cloud_key", 1.0, r"\bAIza[0-9A-Za-z_\-]{35}", ("aiza",)),
    ("secret.github_token", "vcs_token", 1.0, r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
     ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    ("secret.gitlab_token", "vcs_token", 1.0, r"\bglpat-[A-Za-z0-9_\-]{20,}", ("glpat-",)),
    ("secret.slack_token", "chat_token", 1.0, r"\bxox[abposre]-[A-Za-z0-9\-]{10,}", ("xox",)),
    ("secret.slack_webhook", "chat_token", 1.0, r"https://hooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{16,}",
     ("hooks.slack.com",)),
    ("secret.stripe_key", "api_key", 1.0, r"\b[rs]k_live_[0-9a-zA-Z]{20,}", ("k_live_",)),
    ("secret.openai_key", "api_key", 1.0, r"\bsk-(?:proj-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_\-]{32,}", ("sk-",)),
    ("secret.jwt", "jwt", 0.95, r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}", ("eyj",)),
    ("secret.private_key", "private_key", 1.0,
     r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----[\s\S]{0,16384}?(?:-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----|\Z)",
     ("private key",)),
    ("secret.assignment", "generic_secret", 0.9,
     r"(?i:(?<![a-z])(?:api[_\-]?key|apikey|secret(?:[_\-]?key)?|client[_\-]?secret|access[_\-]?key|auth[_\-]?token|access[_\-]?token|"
     r"password|passwd|pwd|private[_\-]?key|token))[\"']?\s*(?:[:=]|=>)\s*[\"']?(?P<v>[A-Za-z0-9/+_\-.~!@#$%^&*]{12,200})",
     ("key", "secret", "token", "passw", "pwd")),
    ("secret.bearer", "generic_secret", 0.9, r"(?i:bearer)\s+(?P<v>[A-Za-z0-9._~+/\-]{20,}=*)", ("bearer",)),
]

# Entries that must begin a line (after optional markup such as "> ", "## ", "**").
LINE_START = {"role.line_header"}

# Triage triggers (Hyperscan byte patterns). Matched on the folded (lower-case)
# input: runs a derived view would decode or collapse. Each reports once per run
# where it can, so long runs cost one callback.
TRIGGER_DESPACE = rb"(?:^|[^a-z0-9_])[a-z][ \t]{1,6}[a-z][ \t]{1,6}[a-z](?:\s|$)"  # three single letters in a row, not inside a word
TRIGGER_BASE64 = rb"(?:^|[^a-z0-9+/_-])[a-z0-9+/_-]{24}"  # start of a base64-looking run
TRIGGER_HEX = rb"(?:^|[^0-9a-f])(?:[0-9a-f]{2}[ :]?){12}"  # start of a hex run (pairs, optional separators)
TRIGGER_PERCENT = rb"%[0-9a-f]{2}"
TRIGGER_ENTITY = rb"&#"
# a markdown comment ``[//]: # (…)`` or link title ``[…](url "…")``: one line, however many it hid
TRIGGER_MARKDOWN = rb"\[//\]:[ \t]*#[ \t]*\(|\]\([^()\s]{1,300}[ \t]+\\?\""
FOLDED_TRIGGERS = (TRIGGER_DESPACE, TRIGGER_BASE64, TRIGGER_HEX, TRIGGER_PERCENT, TRIGGER_ENTITY, TRIGGER_MARKDOWN)
RUN_TRIGGERS = (TRIGGER_BASE64, TRIGGER_HEX)  # the region must extend to the end of the run
# Matched on the raw bytes: the UTF-8 of invisible characters, bidi controls and tag characters.
RAW_TRIGGERS = (
    rb"\xe2\x80[\x8b-\x8f\xaa-\xae]|\xe2\x81[\xa0-\xa4\xa6-\xa9]|\xef\xbb\xbf|\xc2\xad|\xe1\xa0\x8e|\xcd\x8f"
    rb"|\xd8\x9c|\xf3\xa0[\x80-\x81]",
)
