"""Campaigns: many placed calls, run by every worker together through Redis (issue 28 item 3).

`POST /campaigns` (or `hotline campaign run FILE.csv`) stores the rows (`request`, `store`);
each worker's `runner` claims due rows within the campaign's concurrency and the providers'
calls per second (both cluster-wide), inside each callee's calling hours (`hours`), skipping
the do-not-call list (`dnc`), dials them (`dialling`) and settles each dial from the
provider's status callback (`status`) or the call's record, retrying busy, unanswered and
machine-answered rows by `rules`. Its progress and the `campaign.ended` webhook: `campaign`.
The API: `routes`."""
