"""Program datasets (TenSet's role): measured programs of many workloads' tasks on several devices.

``table``: the in-memory dataset and its file format; ``collect``: measuring programs into it;
``split``: train/test splits; ``evaluate``: the yardstick every cost model is judged by.
"""
