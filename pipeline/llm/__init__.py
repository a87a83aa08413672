"""The LLM step of a turn: which tier and reasoning effort the turn can afford, the request, its
fallback and hedge, and the decision the turn record keeps.

```
tiers.py       the tiers on offer (TierOption, LLMTier) and the efforts
settings.py    LLMSettings (provider, tiers), ControllerSettings (the controller's knobs)
client.py      streaming OpenAI-compatible client: LLMClient, LLMStream, ChatMessage
errors.py      LLMError, read from the provider's status, error body and Retry-After
estimates.py   what the controller learns and predicts: LatencyModel, TurnOutcome
controller.py  the latency budget controller's planning: Controller, TurnContext, TurnPlan
attempt.py     one request of a turn, read by its own task: Attempt
routing.py     TierRouter -> CallRouter -> RoutedReply: plan, request, fallback, hedge
decision.py    Decision: what the turn record keeps of it all
```

A *tier* is one of ours (``fast``, ``standard``); the *service tier* is the request's
``service_tier`` field (`pipeline.llm.tiers`). Import from the modules; this package
re-exports nothing.
"""
