"""What can go wrong with a request, each kind carrying the HTTP status it is answered with.

Code that finds a problem raises one of these with a message written for the caller (what
was wrong, where, what was expected); `serve.app` turns any exception into a response in one
place. Anything that is not a `RequestError` is a fault of the server and becomes a logged 500.
"""


class RequestError(Exception):
    """A request the server cannot answer with a prediction; `status` is the HTTP status."""

    status = 400


class BadInput(RequestError):
    """The body is malformed, empty, of the wrong shape or holds NaN or infinity."""

    status = 400


class NotAcceptable(RequestError):
    """No response format the client accepts (the Accept header) is one the server writes."""

    status = 406


class UnsupportedContentType(RequestError):
    """The body's Content-Type is not one the server reads."""

    status = 415


class BodyTimeout(RequestError):
    """The client had not sent the whole body by the request's deadline."""

    status = 408


class ModelUnavailable(RequestError):
    """The model is still loading, failed to load, or did not answer in time."""

    status = 503
