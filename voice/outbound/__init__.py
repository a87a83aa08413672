"""Placing calls: `POST /calls/outbound` (and `hotline dial`) asks a provider to ring a number;
once answered, the provider opens the same media stream as for an inbound call, and that stream
becomes a call that knows it is outbound (its agent, its metadata). One module per concept:
the request (`request`), each provider's REST API (`twilio`, `telnyx`, `vonage`, sharing
`placed`), the call waiting to be answered (`dials`), the stream that answers it (`streams`),
the calls-per-second budget (`rate`), the whole of it (`dialer`) and the route (`routes`)."""
