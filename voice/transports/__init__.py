"""How calls reach Hotline: WebRTC (aiortc) and phone media streams."""
