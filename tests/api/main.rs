//! Black-box tests of sshmode against a real PostgreSQL (TEST_DATABASE_URL, which
//! `scripts/test.sh` provides) and fakes of the services that cannot run here.

mod exec;
mod exec_ssh;
mod foundation;
#[allow(dead_code)]
mod helpers;
#[allow(dead_code)]
mod sshd;
