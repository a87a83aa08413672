"""Phone media streams: the shared stream and admission tokens, the wire vocabulary and the
base of the JSON media protocols, then one module per provider's wire format."""
