"""Call recordings: the stereo recorder (caller left, what the caller heard right), where
recordings are kept (a directory with retention, and an S3-compatible bucket if configured)."""
