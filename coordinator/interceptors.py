"""The shape every coordinator interceptor shares: wrap a method's handler once, then hand the
same wrapped handler to every call of that method."""

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
            self._wrapped[method] = self.wrap(method, handler)
        return self._wrapped[method]

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler to use for `method`; return `handler` to leave it be."""
        raise NotImplementedError


def unary_handler(behaviour, like: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A unary-unary handler running `behaviour`, with the (de)serializers of `like`."""
    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=like.request_deserializer, response_serializer=like.response_serializer
    )


def stream_handler(behaviour, like: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A stream-stream handler running `behaviour`, with the (de)serializers of `like`."""
    return grpc.stream_stream_rpc_method_handler(
        behaviour, request_deserializer=like.request_deserializer, response_serializer=like.response_serializer
    )
