"""Job state in the store, readable from anywhere without torch: the key names, stored JSON and JSONL
records, attempts and their logs, the plan as the store sees it, the remote queue and `rentune status`.

Everything here moves bytes and JSON; `rentune status`, `logs` and `submit` import only this package,
`jobspec` and `store`, so they start fast on a laptop.
"""
