"""The shape every coordinator interceptor shares: wrap a method's unary handler once, then
hand the same wrapped handler to every call of that method."""

from __future__ import annotations

import grpc


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self):
        self._wrapped = {}  # method -> wrapped handler

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method not in self._wrapped:
            handler = await continuation(handler_call_details)
            if handler is None:  # unknown method: grpc answers UNIMPLEMENTED; remember nothing
                return None
            self._wrapped[method] = handler if handler.unary_unary is None else self.wrap(method, handler)
        return self._wrapped[method]

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler to use for `method` (a unary-unary one); return `handler` to leave it be."""
        raise NotImplementedError
