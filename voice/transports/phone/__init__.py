"""Phone media streams: the shared stream and admission tokens, then one module per
provider's wire format."""
