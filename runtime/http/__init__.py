"""The HTTP transport (aiohttp): thin routes over `kubeinfer.runtime.dataplane`."""
