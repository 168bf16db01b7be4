//! Black-box tests of sshmode against a real PostgreSQL (TEST_DATABASE_URL, which
//! `scripts/test.sh` provides) and fakes of the services that cannot run here.

#[allow(dead_code)]
mod fake_llm;
mod foundation;
#[allow(dead_code)]
mod helpers;
mod llm;
