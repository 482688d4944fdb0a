"""Replication: followers, ISR, high watermark, leader epochs."""
