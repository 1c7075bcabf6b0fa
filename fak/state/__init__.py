"""The kernel's own durable state: session ledgers, ref metadata (tool, tags,
admission, quarantine) and forget progress. Content never lands here except the
token ids of user, system and assistant segments (needed to rebuild a session);
tool segments are rebuilt from the CAS, so a shredded ref leaves nothing behind."""
