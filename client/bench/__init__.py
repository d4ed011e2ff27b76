"""Benches of the client's DP engine (gauge, prism-step); ``fedlora bench`` lives in server/bench."""
