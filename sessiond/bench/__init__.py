"""``python -m sessiond.bench``: the performance figures of sessiond.

Targets live here and in ``bench/``, never in timed unit tests. Every figure is
measured in one run on one machine; ratios are taken between figures measured
side by side in that run.
"""
