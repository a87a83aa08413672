"""SIP calls: Hotline as a SIP endpoint (its user agent, SDP, and RTP media)."""
