//! What lifeline reads from the host besides the kernel programs: sockets (sock_diag, in every
//! network namespace), processes and their containers, the client binaries and libraries the
//! probes go on (Go binaries, libssl), the agent's own probe of the endpoints, and what the
//! agent itself is allowed and able to do.
pub mod container;
pub mod exits;
pub mod gobin;
pub mod hold;
pub mod netns;
pub mod privileges;
pub mod prober;
pub mod process;
pub mod redact;
pub mod resources;
pub mod sock_diag;
pub mod sslbin;
