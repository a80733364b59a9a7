"""TokenSwift Live's user interface: rendering only. The engine (tokenswift/) knows nothing about it."""
