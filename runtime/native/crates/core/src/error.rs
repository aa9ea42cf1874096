//! The data plane's one error type: every refusal and failure a request can meet, each
//! carrying its HTTP status, and through it its gRPC code, so one error has one meaning on
//! both transports (a refusal worth retrying later, 503, is gRPC's UNAVAILABLE with the same
//! Retry-After; a deadline passed, 504 and 408, is DEADLINE_EXCEEDED), but for a name taken
//! already, which Triton answers 400 over HTTP and ALREADY_EXISTS over gRPC. The REST body is
//! always `{"error": "..."}`, the shape the Open Inference Protocol and Triton use; over
//! gRPC the message is the status details. The requests metric counts both transports'
//! answers by [`ApiError::status`].

use std::fmt;

/// Which limit a 413 is about and how to raise it, as every 413 says.
pub const REQUEST_LIMIT_HINT: &str = "maxRequestBytes, kubeinfer serve --max-request-bytes; by default a full batch (maxBatchSize rows) of the model's largest allowed inputs as JSON";

/// What went wrong, with the message the client reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// The request is malformed or does not match the model's inputs (400).
    InvalidRequest(String),
    /// No model (or version), or no route, of that name here (404).
    NotFound(String),
    /// The name is taken already (a shared-memory region registered twice): 400 over HTTP
    /// and ALREADY_EXISTS over gRPC, as Triton answers it.
    AlreadyExists(String),
    /// The body stalled, or did not come by the request's deadline (408); the connection
    /// is closed, since the rest of the body may still come.
    RequestTimeout(String),
    /// The body is over the request limit (413): the message names the limit.
    TooLarge(String),
    /// The queue is full, or the request was shed for a more urgent one (503).
    Overloaded(String),
    /// Not started, draining, or the engine stuck (503).
    NotReady(String),
    /// The request's deadline passed before it ran: never executed (504).
    DeadlineExceeded(String),
    /// Its batch was still on the engine at the latest deadline of its requests (504).
    EngineTimeout(String),
    /// The engine failed on the request's batch, or answered rows that are not the
    /// batch's (500): the one 500 answered on purpose.
    EngineFailed(String),
    /// Anything unexpected: the server's bug, logged where it was caught (500).
    Internal,
}

/// gRPC status codes the server answers with (their numbers in gRPC's enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcCode {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
}

impl ApiError {
    /// A 413 for a request over the limit: `message`, then which limit and how to raise it.
    pub fn over_request_limit(message: impl fmt::Display) -> Self {
        ApiError::TooLarge(format!("{message} ({REQUEST_LIMIT_HINT})"))
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::InvalidRequest(message.into())
    }

    /// The HTTP status: the single status mapping of the server.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::InvalidRequest(_) | ApiError::AlreadyExists(_) => 400,
            ApiError::NotFound(_) => 404,
            ApiError::RequestTimeout(_) => 408,
            ApiError::TooLarge(_) => 413,
            ApiError::Overloaded(_) | ApiError::NotReady(_) => 503,
            ApiError::DeadlineExceeded(_) | ApiError::EngineTimeout(_) => 504,
            ApiError::EngineFailed(_) | ApiError::Internal => 500,
        }
    }

    /// The gRPC code that follows from the HTTP status (a name taken: its own).
    pub fn grpc_code(&self) -> GrpcCode {
        if let ApiError::AlreadyExists(_) = self {
            return GrpcCode::AlreadyExists;
        }
        match self.status() {
            400 => GrpcCode::InvalidArgument,
            404 => GrpcCode::NotFound,
            408 | 504 => GrpcCode::DeadlineExceeded,
            413 => GrpcCode::ResourceExhausted,
            503 => GrpcCode::Unavailable,
            _ => GrpcCode::Internal,
        }
    }

    /// Seconds a client should wait before it retries (the 503s').
    pub fn retry_after_seconds(&self) -> Option<u32> {
        match self {
            ApiError::Overloaded(_) | ApiError::NotReady(_) => Some(1),
            _ => None,
        }
    }

    /// Whether the connection closes after this answer (the rest of the request cannot
    /// be read, or is not worth reading).
    pub fn closes_connection(&self) -> bool {
        matches!(self, ApiError::RequestTimeout(_))
    }

    pub fn message(&self) -> &str {
        match self {
            ApiError::InvalidRequest(m)
            | ApiError::NotFound(m)
            | ApiError::AlreadyExists(m)
            | ApiError::RequestTimeout(m)
            | ApiError::TooLarge(m)
            | ApiError::Overloaded(m)
            | ApiError::NotReady(m)
            | ApiError::DeadlineExceeded(m)
            | ApiError::EngineTimeout(m)
            | ApiError::EngineFailed(m) => m,
            ApiError::Internal => "internal server error",
        }
    }

    /// The REST body: `{"error": "<message>"}`.
    pub fn json_body(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "error": self.message() }))
            .expect("a JSON object of one string serializes")
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status(), self.message())
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_error_has_one_meaning_on_both_transports() {
        let cases = [
            (ApiError::invalid("x"), 400, GrpcCode::InvalidArgument),
            (ApiError::NotFound("x".into()), 404, GrpcCode::NotFound),
            (
                ApiError::AlreadyExists("x".into()),
                400,
                GrpcCode::AlreadyExists,
            ),
            (
                ApiError::RequestTimeout("x".into()),
                408,
                GrpcCode::DeadlineExceeded,
            ),
            (
                ApiError::over_request_limit("x"),
                413,
                GrpcCode::ResourceExhausted,
            ),
            (ApiError::Overloaded("x".into()), 503, GrpcCode::Unavailable),
            (ApiError::NotReady("x".into()), 503, GrpcCode::Unavailable),
            (
                ApiError::DeadlineExceeded("x".into()),
                504,
                GrpcCode::DeadlineExceeded,
            ),
            (
                ApiError::EngineTimeout("x".into()),
                504,
                GrpcCode::DeadlineExceeded,
            ),
            (ApiError::EngineFailed("x".into()), 500, GrpcCode::Internal),
            (ApiError::Internal, 500, GrpcCode::Internal),
        ];
        for (error, status, code) in cases {
            assert_eq!(error.status(), status, "{error:?}");
            assert_eq!(error.grpc_code(), code, "{error:?}");
        }
    }

    #[test]
    fn the_body_is_the_protocols_error_object() {
        let body = ApiError::invalid("input \"x\" is \"odd\"").json_body();
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"error": "input \"x\" is \"odd\""})
        );
        assert_eq!(ApiError::Internal.message(), "internal server error");
    }

    #[test]
    fn a_413_names_the_limit_and_how_to_raise_it() {
        let error = ApiError::over_request_limit("the body (9 bytes) is over 8 bytes");
        assert!(
            error
                .message()
                .starts_with("the body (9 bytes) is over 8 bytes (maxRequestBytes")
        );
        assert_eq!(
            ApiError::Overloaded("full".into()).retry_after_seconds(),
            Some(1)
        );
        assert!(ApiError::RequestTimeout("slow".into()).closes_connection());
    }
}
