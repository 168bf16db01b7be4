//! Which master key belongs to a database. [`open`] is how the service, `doctor` and the
//! commands open the vault: it reads the key file and checks it against the database's canary
//! record (`vault_canary`), so a wrong key is refused at start instead of failing every target
//! later. It creates a key only where nothing is sealed yet; over sealed secrets a missing key
//! file is an error naming the path, never a fresh key. [`reseal_canary`] moves the canary to a
//! new key inside the rotation's transaction.
//!
//! Never: creates a key while a target holds a sealed secret; replaces a canary that the key
//! does not open while anything is sealed; puts key bytes or plaintext in an error.

use std::fmt;
use std::io;
use std::path::Path;

use sqlx::{PgConnection, PgPool};

use crate::vault::{Vault, VaultError};

/// What to do when the key is missing or wrong while secrets are sealed.
const RESTORE: &str = "point SSHMODE_MASTER_KEY_FILE at the key that sealed them, or restore \
                       that key from your backup";

/// Why the master key was refused: what is wrong, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub problem: String,
    pub advice: Option<String>,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.advice {
            Some(a) => write!(f, "{}: {a}", self.problem),
            None => f.write_str(&self.problem),
        }
    }
}

impl std::error::Error for KeyError {}

impl KeyError {
    fn db(e: sqlx::Error) -> KeyError {
        KeyError {
            problem: format!("the vault's records could not be read: {e}"),
            advice: Some("check that the database is reachable".into()),
        }
    }

    fn wrong_key(path: &Path, sealed: i64) -> KeyError {
        if sealed == 0 {
            return KeyError {
                problem: format!(
                    "the master key {} (SSHMODE_MASTER_KEY_FILE) is not the key of this \
                     database's vault (it does not open its canary record)",
                    path.display()
                ),
                advice: Some(format!(
                    "{RESTORE}; no target secret is sealed yet, so to start a new vault instead, \
                     move {} away and start again",
                    path.display()
                )),
            };
        }
        KeyError {
            problem: format!(
                "the master key {} (SSHMODE_MASTER_KEY_FILE) does not open this database's vault: \
                 the secrets of {sealed} target(s) were sealed with another key",
                path.display()
            ),
            advice: Some(RESTORE.into()),
        }
    }
}

/// Opens the master key at `path` for database `db`:
/// - the key file exists: it must open the canary; before there is one, it must open a
///   sealed record when any exists, and the canary is then written under it;
/// - the key file is missing: refused while any target holds a sealed secret (no file is
///   created); otherwise a new key is created (0600) and the canary written under it.
pub async fn open(db: &PgPool, path: &Path) -> Result<Vault, KeyError> {
    let canary = read_canary(db).await.map_err(KeyError::db)?;
    match Vault::open_existing(path) {
        Ok(vault) => {
            match canary {
                Some(c) if vault.opens_canary(&c) => return Ok(vault),
                Some(_) => {
                    let sealed = super::sealed_count(db).await.map_err(KeyError::db)?;
                    return Err(KeyError::wrong_key(path, sealed));
                }
                None => {
                    let sealed = super::sealed_count(db).await.map_err(KeyError::db)?;
                    if sealed > 0
                        && !super::opens_a_record(db, &vault)
                            .await
                            .map_err(KeyError::db)?
                    {
                        return Err(KeyError::wrong_key(path, sealed));
                    }
                }
            }
            write_canary(db, &vault, false).await?;
            Ok(vault)
        }
        Err(VaultError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            let sealed = super::sealed_count(db).await.map_err(KeyError::db)?;
            if sealed > 0 {
                return Err(KeyError {
                    problem: format!(
                        "no master key at {} (SSHMODE_MASTER_KEY_FILE), but the database holds \
                         the sealed secrets of {sealed} target(s); a new key would open none of \
                         them, so none was created",
                        path.display()
                    ),
                    advice: Some(RESTORE.into()),
                });
            }
            // Another process may create it at the same moment: then both use that one.
            let vault = Vault::open_or_create(path).map_err(|e| unreadable(path, e))?;
            if canary.is_some() {
                tracing::warn!(
                    vault.key = %path.display(),
                    "no master key was found and no target secret is sealed: a new key was created and the vault's canary sealed again with it"
                );
            } else {
                tracing::info!(vault.key = %path.display(), "a new master key was created");
            }
            write_canary(db, &vault, canary.is_some()).await?;
            Ok(vault)
        }
        Err(e) => Err(unreadable(path, e)),
    }
}

fn unreadable(path: &Path, e: VaultError) -> KeyError {
    KeyError {
        problem: format!(
            "cannot open the master key {} (SSHMODE_MASTER_KEY_FILE): {e}",
            path.display()
        ),
        advice: None,
    }
}

async fn read_canary(db: &PgPool) -> Result<Option<Vec<u8>>, sqlx::Error> {
    sqlx::query_scalar("SELECT sealed FROM vault_canary WHERE id = 1")
        .fetch_optional(db)
        .await
}

/// Writes the canary under `vault` (over an existing one only when `replace`), then checks the
/// one stored opens: another process may have written its own first.
async fn write_canary(db: &PgPool, vault: &Vault, replace: bool) -> Result<(), KeyError> {
    let sealed = vault.seal_canary().map_err(|e| KeyError {
        problem: format!("the vault's canary could not be sealed: {e}"),
        advice: None,
    })?;
    let sql = if replace {
        "INSERT INTO vault_canary (id, sealed) VALUES (1, $1) \
         ON CONFLICT (id) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now()"
    } else {
        "INSERT INTO vault_canary (id, sealed) VALUES (1, $1) ON CONFLICT (id) DO NOTHING"
    };
    sqlx::query(sql)
        .bind(sealed)
        .execute(db)
        .await
        .map_err(KeyError::db)?;
    match read_canary(db).await.map_err(KeyError::db)? {
        Some(c) if vault.opens_canary(&c) => Ok(()),
        _ => {
            let sealed = super::sealed_count(db).await.map_err(KeyError::db)?;
            Err(KeyError::wrong_key(vault.path(), sealed))
        }
    }
}

/// Whether `vault` opens the database's canary; `None` when it has none yet.
pub async fn opens_canary(db: &PgPool, vault: &Vault) -> Result<Option<bool>, sqlx::Error> {
    Ok(read_canary(db).await?.map(|c| vault.opens_canary(&c)))
}

/// Seals the canary again under `new`, in the rotation's transaction `tx` (locking its row).
/// `false` when `old` does not open the canary there (the rotation must stop); a vault without
/// one gets one under `new`.
pub async fn reseal_canary(
    tx: &mut PgConnection,
    old: &Vault,
    new: &Vault,
) -> Result<bool, sqlx::Error> {
    let current: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT sealed FROM vault_canary WHERE id = 1 FOR UPDATE")
            .fetch_optional(&mut *tx)
            .await?;
    if current.as_deref().is_some_and(|c| !old.opens_canary(c)) {
        return Ok(false);
    }
    let sealed = new
        .seal_canary()
        .map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    sqlx::query(
        "INSERT INTO vault_canary (id, sealed) VALUES (1, $1) \
         ON CONFLICT (id) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now()",
    )
    .bind(sealed)
    .execute(&mut *tx)
    .await?;
    Ok(true)
}
