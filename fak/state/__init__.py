"""The kernel's own durable state: session ledgers, ref metadata (tool, tags,
admission, quarantine) and forget progress. Content never lands here in the clear
except the token ids and text of trusted segments (system, user, and turns with no
content provenance), needed to rebuild a session. Tool segments are rebuilt from the
CAS; a segment derived from tool content is sealed under a key derived from its refs'
data keys, which live in the key database (``fak.state.seal``), so a shredded ref
leaves nothing here that opens."""
