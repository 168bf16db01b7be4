//! The vault: SSH secrets encrypted with AES-256-GCM under a master key file (mode 0600), a
//! fresh nonce per record, and associated data naming the record's place: the target row
//! (alias and generation) and the field (key, certificate or password). Plaintext leaves only
//! towards SSH authentication.
//!
//! A sealed record is `version (1 byte) || nonce (12 bytes) || ciphertext || tag (16 bytes)`.
//! Binding the record's place as associated data means a record copied onto another target's
//! row, onto a later target that reuses a removed alias, or into another field of its own row
//! fails to open instead of authenticating with the wrong secret. Version 1 records (alias
//! only) are opened once more, by the start-up re-seal, and never again. The vault never logs, formats or returns
//! plaintext in an error, never holds the raw key outside `Zeroizing` memory (the working copy
//! lives inside ring's key schedule), and never accepts a key file other users could read.
//!
//! Which key belongs to a database is [`keyring`]'s part: it opens the key file only where the
//! key opens the database's canary record, and never creates a key over sealed secrets.

use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

/// Length of the master key: AES-256.
const KEY_LEN: usize = 32;
/// Format version of sealed records; bump when the layout, algorithm or associated data
/// changes. 2: bound to (alias, generation, field).
const VERSION: u8 = 2;
/// The first format: the alias alone as associated data (read only to re-seal).
const LEGACY_VERSION: u8 = 1;

/// Which secret of a target a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The private key.
    Key,
    /// The OpenSSH user certificate.
    Cert,
    Password,
}

impl Field {
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Key => "key",
            Field::Cert => "cert",
            Field::Password => "password",
        }
    }
}

/// Where a record belongs: one field of one target row. Its bytes are the record's associated
/// data, so it opens only there.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    pub alias: &'a str,
    /// The row's generation: a new one each time the alias is added.
    pub generation: i64,
    pub field: Field,
}

impl Slot<'_> {
    /// `sshmode.vault.v2 NUL generation (8 bytes, big endian) field NUL alias`: unambiguous,
    /// since the field names and aliases contain no NUL.
    fn aad(&self) -> Vec<u8> {
        let mut aad = Vec::with_capacity(48 + self.alias.len());
        aad.extend_from_slice(b"sshmode.vault.v2\0");
        aad.extend_from_slice(&self.generation.to_be_bytes());
        aad.extend_from_slice(self.field.as_str().as_bytes());
        aad.push(0);
        aad.extend_from_slice(self.alias.as_bytes());
        aad
    }
}
/// The canary's associated data: unlike a slot's, it holds no generation or alias.
const CANARY_AAD: &[u8] = b"sshmode.vault.canary.v1";
/// What the canary holds.
const CANARY_TEXT: &[u8] = b"sshmode vault canary";
/// AES-GCM tag length.
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = 1 + NONCE_LEN;

/// Failures of the vault. No variant carries key or plaintext bytes.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("vault key file {path}: could not {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "vault key file {path} is accessible to group or others (mode {mode:04o}); \
         restrict it with `chmod 600 {path}` and start again"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error(
        "vault key file {path} holds {len} bytes, expected {KEY_LEN}; restore the original key \
         file, or move this one away to start a new vault (secrets sealed under the old key \
         will then have to be imported again)"
    )]
    KeyLength { path: PathBuf, len: u64 },
    #[error("vault key file {path} is not a regular file; point SSHMODE_MASTER_KEY_FILE at a file")]
    NotAFile { path: PathBuf },
    #[error("the system random number generator failed")]
    Random,
    #[error("the secret for `{alias}` is too large to seal")]
    Seal { alias: String },
    #[error("the sealed secret for `{alias}` is malformed ({reason})")]
    Malformed { alias: String, reason: &'static str },
    #[error(
        "the sealed secret for `{alias}` could not be decrypted: it was sealed under another key \
         or for another target, or it was altered; import the secret again"
    )]
    Decrypt { alias: String },
}

/// The master key, ready to seal and open records.
pub struct Vault {
    /// The AES-256-GCM key. ring keeps only the expanded key schedule; the raw bytes it was
    /// built from were zeroized right after.
    key: LessSafeKey,
    /// Source of fresh nonces; one per sealed record, never reused.
    rng: SystemRandom,
    /// Where the key came from, for diagnostics only.
    path: PathBuf,
    /// The key of the tags of masked secrets ([`Vault::tag`]): derived from the master key
    /// with HKDF under a fixed label, so each deployment tags differently and no new setting
    /// is needed; it opens nothing.
    mask_key: ring::hmac::Key,
    /// SHA-256 digests of the master key written in base64 (standard and URL-safe, padded or
    /// not) and hex (lower and upper case), so a printed key file is masked
    /// ([`Vault::find_secrets`]) without a copy of the key kept beside its schedule.
    master_forms: Vec<[u8; 32]>,
}

/// The label the tag key is derived under.
const MASK_LABEL: &[u8] = b"sshmode secret mask tag v1";

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vault")
            .field("path", &self.path)
            .field("key", &"[redacted]")
            .finish()
    }
}

impl Vault {
    /// Opens the master key at `path`, creating it (32 random bytes, mode 0600, parent
    /// directories 0700) when it does not exist. An existing file is refused when group or
    /// others may access it, or when its length is wrong. It does not look at the database:
    /// the service and the commands open the key through [`crate::target::keyring::open`], which refuses
    /// to create one while secrets are sealed.
    pub fn open_or_create(path: &Path) -> Result<Vault, VaultError> {
        let rng = SystemRandom::new();
        let key = match Self::read_key(path) {
            Err(VaultError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                match Self::create_key(path, &rng) {
                    // Lost a race with another process creating it: use theirs.
                    Err(VaultError::Io { source, .. })
                        if source.kind() == io::ErrorKind::AlreadyExists =>
                    {
                        Self::read_key(path)?
                    }
                    other => other?,
                }
            }
            other => other?,
        };
        Self::with_key(path, &key[..], rng)
    }

    /// Opens the master key at `path`, which must exist (it is never created here).
    pub fn open_existing(path: &Path) -> Result<Vault, VaultError> {
        let key = Self::read_key(path)?;
        Self::with_key(path, &key[..], SystemRandom::new())
    }

    /// A vault under a random key held only in memory, for a check that needs a vault but
    /// opens no record (doctor's isolation check); nothing it seals outlives it.
    pub fn ephemeral() -> Result<Vault, VaultError> {
        let rng = SystemRandom::new();
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        rng.fill(&mut key[..]).map_err(|_| VaultError::Random)?;
        Self::with_key(Path::new("(in memory)"), &key[..], rng)
    }

    /// Where the key was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates a new master key at `path`, which must not exist yet (`vault rotate-key`
    /// writes the next key beside the current one this way), and opens it.
    pub fn create(path: &Path) -> Result<Vault, VaultError> {
        let rng = SystemRandom::new();
        let key = Self::create_key(path, &rng)?;
        Self::with_key(path, &key[..], rng)
    }

    fn with_key(path: &Path, key: &[u8], rng: SystemRandom) -> Result<Vault, VaultError> {
        let unbound = UnboundKey::new(&AES_256_GCM, key).map_err(|_| VaultError::KeyLength {
            path: path.to_owned(),
            len: key.len() as u64,
        })?;
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, MASK_LABEL).extract(key);
        let mask_key: ring::hmac::Key = prk
            .expand(&[MASK_LABEL], ring::hmac::HMAC_SHA256)
            .expect("HKDF-SHA256 expands to one HMAC-SHA256 key")
            .into();
        let master_forms = master_forms(key);
        Ok(Vault {
            key: LessSafeKey::new(unbound),
            rng,
            path: path.to_owned(),
            mask_key,
            master_forms,
        })
    }

    fn read_key(path: &Path) -> Result<Zeroizing<[u8; KEY_LEN]>, VaultError> {
        let io_err = |action| {
            move |source| VaultError::Io {
                path: path.to_owned(),
                action,
                source,
            }
        };
        let mut file = File::open(path).map_err(io_err("open it"))?;
        // Check the opened file itself, not the path, so a swap between check and read is moot.
        let meta = file.metadata().map_err(io_err("inspect it"))?;
        if !meta.is_file() {
            return Err(VaultError::NotAFile {
                path: path.to_owned(),
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(VaultError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        if meta.len() != KEY_LEN as u64 {
            return Err(VaultError::KeyLength {
                path: path.to_owned(),
                len: meta.len(),
            });
        }
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        file.read_exact(&mut key[..]).map_err(io_err("read it"))?;
        // The file must not have grown between the length check and the read.
        let mut probe = [0u8; 1];
        if file.read(&mut probe).map_err(io_err("read it"))? != 0 {
            return Err(VaultError::KeyLength {
                path: path.to_owned(),
                len: meta.len() + 1,
            });
        }
        Ok(key)
    }

    fn create_key(path: &Path, rng: &SystemRandom) -> Result<Zeroizing<[u8; KEY_LEN]>, VaultError> {
        let io_err = |action| {
            move |source| VaultError::Io {
                path: path.to_owned(),
                action,
                source,
            }
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io_err("create its directory"))?;
        }
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        rng.fill(&mut key[..]).map_err(|_| VaultError::Random)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err("create it"))?;
        let written = file
            .write_all(&key[..])
            .and_then(|()| file.sync_all())
            .map_err(io_err("write it"));
        if let Err(e) = written {
            // A half-written key would be refused next time anyway; do not leave it behind.
            let _ = fs::remove_file(path);
            return Err(e);
        }
        Ok(key)
    }

    /// Encrypts `plaintext` for `place`: `version || nonce || ciphertext+tag`.
    pub fn seal(&self, place: &Slot<'_>, plaintext: &[u8]) -> Result<Vec<u8>, VaultError> {
        self.seal_with(VERSION, &place.aad(), place.alias, plaintext)
    }

    /// Decrypts a record sealed for `place`. A record of another place (another target,
    /// an earlier target with this alias, another field), a wrong key, a version 1 record, or
    /// any altered or missing byte fails.
    pub fn open(&self, place: &Slot<'_>, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        self.open_with(VERSION, &place.aad(), place.alias, sealed)
    }

    /// Seals the canary: a fixed text under associated data no target slot can have, so
    /// that whether a key is the database's can be told without a target.
    pub fn seal_canary(&self) -> Result<Vec<u8>, VaultError> {
        self.seal_with(VERSION, CANARY_AAD, "(canary)", CANARY_TEXT)
    }

    /// Whether `sealed` is a canary sealed under this key.
    pub fn opens_canary(&self, sealed: &[u8]) -> bool {
        self.open_with(VERSION, CANARY_AAD, "(canary)", sealed)
            .is_ok_and(|plain| plain[..] == *CANARY_TEXT)
    }

    /// Opens a version 1 record (the alias alone as associated data), only so that the
    /// start-up re-seal can seal it again for its place.
    pub(crate) fn open_legacy(
        &self,
        alias: &str,
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        self.open_with(LEGACY_VERSION, alias.as_bytes(), alias, sealed)
    }

    fn seal_with(
        &self,
        version: u8,
        aad: &[u8],
        alias: &str,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, VaultError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| VaultError::Random)?;
        let mut out = Vec::with_capacity(HEADER_LEN + plaintext.len() + TAG_LEN);
        out.push(version);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let sealed = self.key.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut out[HEADER_LEN..],
        );
        match sealed {
            Ok(tag) => {
                out.extend_from_slice(tag.as_ref());
                Ok(out)
            }
            Err(_) => {
                // The buffer still holds plaintext.
                zeroize::Zeroize::zeroize(&mut out);
                Err(VaultError::Seal {
                    alias: alias.to_owned(),
                })
            }
        }
    }

    fn open_with(
        &self,
        version: u8,
        aad: &[u8],
        alias: &str,
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        let malformed = |reason| VaultError::Malformed {
            alias: alias.to_owned(),
            reason,
        };
        if sealed.len() < HEADER_LEN + TAG_LEN {
            return Err(malformed("too short"));
        }
        if sealed[0] != version {
            return Err(malformed("unexpected format version"));
        }
        let nonce = Nonce::try_assume_unique_for_key(&sealed[1..HEADER_LEN])
            .map_err(|_| malformed("bad nonce"))?;
        let mut buf = Zeroizing::new(sealed[HEADER_LEN..].to_vec());
        let len = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut buf[..])
            .map_err(|_| VaultError::Decrypt {
                alias: alias.to_owned(),
            })?
            .len();
        buf.truncate(len);
        Ok(buf)
    }

    /// Whether `text` holds the plaintext of any of `records` (the sealed secrets of targets,
    /// as stored): the whole secret, or for a key or certificate any line of its encoded body.
    /// Each record is opened here, compared and wiped; only the answer leaves. A record that
    /// does not open is skipped (it could not authenticate either).
    pub fn contains_secret(&self, text: &str, records: &[SealedRecord<'_>]) -> bool {
        records.iter().any(|r| match self.open(&r.place, r.sealed) {
            Ok(plain) => match std::str::from_utf8(&plain) {
                Ok(secret) => holds(text, secret),
                Err(_) => false,
            },
            Err(_) => false,
        })
    }

    /// The tag of a masked secret: the first two bytes, in hex, of an HMAC-SHA256 of the value
    /// under this deployment's tag key. Enough to tell two secrets apart in one output; a short
    /// or guessable secret cannot be recovered from it without the key.
    pub fn tag(&self, value: &[u8]) -> String {
        let t = ring::hmac::sign(&self.mask_key, value);
        hex::encode(&t.as_ref()[..2])
    }

    /// Where `text` holds the plaintext of any of `records` (plain, base64 or hex; for a key
    /// any longer line of its body, see [`crate::mask::find_known`]) or the master key itself
    /// in base64 or hex. Each record is opened here, searched for and wiped; only the places,
    /// kinds and tags leave.
    pub fn find_secrets(
        &self,
        text: &str,
        records: &[SealedRecord<'_>],
    ) -> Vec<crate::mask::Found> {
        let mut out = Vec::new();
        for r in records {
            let Ok(plain) = self.open(&r.place, r.sealed) else {
                continue;
            };
            let Ok(secret) = std::str::from_utf8(&plain) else {
                continue;
            };
            let kind = match r.place.field {
                Field::Key => "target-key",
                Field::Cert => "target-cert",
                Field::Password => "target-password",
            };
            let tag = self.tag(secret.trim().as_bytes());
            out.extend(crate::mask::find_known(text, secret, kind, &tag));
        }
        out.extend(self.find_master_key(text));
        out
    }

    /// Where `text` holds the master key in base64 or hex.
    fn find_master_key(&self, text: &str) -> Vec<crate::mask::Found> {
        static CANDIDATE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(r"[A-Za-z0-9+/_\-]+={0,2}").expect("valid")
        });
        let mut out = Vec::new();
        // Whole words only, of the lengths the key's forms have (base64 43 or 44, hex 64).
        for m in CANDIDATE
            .find_iter(text)
            .filter(|m| matches!(m.len(), 43 | 44 | 64))
        {
            let d = ring::digest::digest(&ring::digest::SHA256, m.as_str().as_bytes());
            if self.master_forms.iter().any(|f| f[..] == *d.as_ref()) {
                out.push(crate::mask::Found {
                    range: m.range(),
                    kind: "master-key",
                    tag: Some(self.tag(d.as_ref())),
                });
            }
        }
        out
    }

    /// Seals a version 1 record, as the first format did (tests of the re-seal only).
    #[cfg(test)]
    fn seal_legacy(&self, alias: &str, plaintext: &[u8]) -> Result<Vec<u8>, VaultError> {
        self.seal_with(LEGACY_VERSION, alias.as_bytes(), alias, plaintext)
    }
}

/// One sealed record and the place it was sealed for (a target row's field).
#[derive(Debug, Clone, Copy)]
pub struct SealedRecord<'a> {
    pub place: Slot<'a>,
    pub sealed: &'a [u8],
}

/// The digests of the master key's base64 and hex forms.
fn master_forms(key: &[u8]) -> Vec<[u8; 32]> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let forms = [
        Zeroizing::new(STANDARD.encode(key)),
        Zeroizing::new(STANDARD_NO_PAD.encode(key)),
        Zeroizing::new(URL_SAFE.encode(key)),
        Zeroizing::new(URL_SAFE_NO_PAD.encode(key)),
        Zeroizing::new(hex::encode(key)),
        Zeroizing::new(hex::encode_upper(key)),
    ];
    forms
        .iter()
        .map(|f| {
            let mut d = [0u8; 32];
            d.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, f.as_bytes()).as_ref());
            d
        })
        .collect()
}

/// Shortest secret matched anywhere in a text; a shorter one must stand as a whole word.
const MIN_SUBSTRING: usize = 8;
/// Shortest line of a key or certificate body that counts as a piece of it.
const MIN_KEY_LINE: usize = 16;

/// Whether `text` holds `secret`: the whole of it, or (for a multi-line secret such as a key)
/// any of its longer lines. Comparison only; nothing is copied out.
pub fn holds(text: &str, secret: &str) -> bool {
    let secret = secret.trim();
    if secret.is_empty() {
        return false;
    }
    if secret.contains('\n') {
        return text.contains(secret)
            || secret
                .lines()
                .map(str::trim)
                .filter(|l| l.len() >= MIN_KEY_LINE && !l.starts_with("-----"))
                .any(|l| text.contains(l));
    }
    if secret.len() >= MIN_SUBSTRING {
        // A one-line certificate (`type base64 comment`): its base64 part alone counts too.
        return text.contains(secret)
            || secret
                .split_whitespace()
                .filter(|w| w.len() >= 32)
                .any(|w| text.contains(w));
    }
    text.split(|c: char| c.is_whitespace() || "\"'`,;:()[]{}<>=".contains(c))
        .any(|w| w == secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The key field of generation 7 of `alias`.
    fn at(alias: &str) -> Slot<'_> {
        Slot {
            alias,
            generation: 7,
            field: Field::Key,
        }
    }

    fn fresh() -> (tempfile::TempDir, PathBuf, Vault) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/keys/master.key");
        let vault = Vault::open_or_create(&path).unwrap();
        (dir, path, vault)
    }

    #[test]
    fn contains_secret_opens_compares_and_skips_foreign_records() {
        let (_d, _p, v) = fresh();
        let pw = v
            .seal(
                &Slot {
                    alias: "db",
                    generation: 3,
                    field: Field::Password,
                },
                b"hunter2-correct-horse",
            )
            .unwrap();
        let rec = SealedRecord {
            place: Slot {
                alias: "db",
                generation: 3,
                field: Field::Password,
            },
            sealed: &pw,
        };
        assert!(v.contains_secret("the db password is hunter2-correct-horse ok", &[rec]));
        assert!(!v.contains_secret("the db password is in the vault", &[rec]));
        // Sealed for another place: it does not open, so it matches nothing.
        let wrong = SealedRecord {
            place: at("db"),
            sealed: &pw,
        };
        assert!(!v.contains_secret("hunter2-correct-horse", &[wrong]));
    }

    #[test]
    fn find_secrets_tags_by_deployment_and_finds_encodings_and_the_master_key() {
        use base64::Engine as _;
        let (_d, path, v) = fresh();
        let place = Slot {
            alias: "db",
            generation: 3,
            field: Field::Password,
        };
        let pw = v.seal(&place, b"hunter2-correct-horse").unwrap();
        let rec = SealedRecord { place, sealed: &pw };
        let b64 = base64::engine::general_purpose::STANDARD;
        let master = std::fs::read(&path).unwrap();
        let text = format!(
            "a {} b {} c {} d {}",
            b64.encode("hunter2-correct-horse"),
            hex::encode("hunter2-correct-horse"),
            b64.encode(&master),
            hex::encode(&master),
        );
        let found = v.find_secrets(&text, &[rec]);
        let kinds: Vec<&str> = found.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                "target-password",
                "target-password",
                "master-key",
                "master-key"
            ],
            "{found:?}"
        );
        // One value, one tag, whatever its encoding; the tag is this deployment's.
        assert_eq!(found[0].tag, found[1].tag);
        assert_eq!(
            found[0].tag.as_deref(),
            Some(v.tag(b"hunter2-correct-horse").as_str())
        );
        let (_d2, _p2, other) = fresh();
        // Another deployment tags differently (eight values, so a 16-bit collision cannot pass).
        assert!((0u8..8).any(|i| v.tag(&[i]) != other.tag(&[i])));
        assert_eq!(v.tag(b"x").len(), 4);
        assert!(v.find_secrets("nothing here", &[rec]).is_empty());
    }

    #[test]
    fn holds_matches_whole_secrets_short_words_and_key_lines() {
        assert!(holds("pw: s3cr3t!", "s3cr3t!"));
        assert!(!holds("pws3cr3t!x", "s3cr3t!"));
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n-----END OPENSSH PRIVATE KEY-----\n";
        assert!(holds("a piece: b3BlbnNzaC1rZXktdjEAAAAABG5vbmU", key));
        assert!(!holds("-----END OPENSSH PRIVATE KEY-----", key));
        assert!(!holds("anything", "  "));
    }

    #[test]
    fn round_trip() {
        let (_d, _p, v) = fresh();
        let sealed = v.seal(&at("web-1"), b"-----BEGIN KEY-----").unwrap();
        assert_eq!(sealed.len(), 1 + 12 + 19 + 16);
        assert_eq!(sealed[0], VERSION);
        assert_eq!(
            &v.open(&at("web-1"), &sealed).unwrap()[..],
            b"-----BEGIN KEY-----"
        );
        let empty = v.seal(&at("web-1"), b"").unwrap();
        assert!(v.open(&at("web-1"), &empty).unwrap().is_empty());
    }

    #[test]
    fn sealing_twice_gives_different_records() {
        let (_d, _p, v) = fresh();
        let a = v.seal(&at("db"), b"hunter2").unwrap();
        let b = v.seal(&at("db"), b"hunter2").unwrap();
        assert_ne!(a, b);
        assert_ne!(a[1..13], b[1..13], "nonces must differ");
        assert!(
            !a.windows(7).any(|w| w == b"hunter2"),
            "ciphertext holds plaintext"
        );
    }

    #[test]
    fn wrong_alias_fails() {
        let (_d, _p, v) = fresh();
        let sealed = v.seal(&at("db"), b"hunter2").unwrap();
        let err = v.open(&at("web"), &sealed).unwrap_err();
        assert!(matches!(err, VaultError::Decrypt { .. }), "{err:?}");
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn a_record_opens_only_in_its_own_row_and_field() {
        let (_d, _p, v) = fresh();
        let sealed = v.seal(&at("db"), b"hunter2").unwrap();
        // The alias added again later (a new generation): refused.
        let later = Slot {
            generation: 8,
            ..at("db")
        };
        assert!(matches!(
            v.open(&later, &sealed),
            Err(VaultError::Decrypt { .. })
        ));
        // Another field of the same row (a key moved into the certificate column): refused.
        for field in [Field::Cert, Field::Password] {
            let other = Slot { field, ..at("db") };
            assert!(v.open(&other, &sealed).is_err(), "{field:?}");
        }
        assert_eq!(&v.open(&at("db"), &sealed).unwrap()[..], b"hunter2");
    }

    #[test]
    fn version_1_records_open_only_for_the_reseal() {
        let (_d, _p, v) = fresh();
        let old = v.seal_legacy("db", b"hunter2").unwrap();
        assert_eq!(old[0], LEGACY_VERSION);
        assert!(
            v.open(&at("db"), &old).is_err(),
            "a v1 record is not a v2 one"
        );
        assert_eq!(&v.open_legacy("db", &old).unwrap()[..], b"hunter2");
        assert!(v.open_legacy("web", &old).is_err());
        // Nor does a v2 record pass as v1.
        let new = v.seal(&at("db"), b"hunter2").unwrap();
        assert!(v.open_legacy("db", &new).is_err());
    }

    #[test]
    fn any_flipped_bit_fails() {
        let (_d, _p, v) = fresh();
        let sealed = v.seal(&at("db"), b"hunter2").unwrap();
        for i in 0..sealed.len() {
            for bit in [0x01u8, 0x80] {
                let mut t = sealed.clone();
                t[i] ^= bit;
                assert!(
                    v.open(&at("db"), &t).is_err(),
                    "byte {i} bit {bit:#x} accepted"
                );
            }
        }
    }

    #[test]
    fn truncated_or_extended_records_fail() {
        let (_d, _p, v) = fresh();
        let sealed = v.seal(&at("db"), b"hunter2").unwrap();
        for n in 0..sealed.len() {
            assert!(
                v.open(&at("db"), &sealed[..n]).is_err(),
                "prefix of {n} bytes accepted"
            );
        }
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(v.open(&at("db"), &longer).is_err());
    }

    #[test]
    fn another_key_cannot_open() {
        let (_d1, _p1, v1) = fresh();
        let (_d2, _p2, v2) = fresh();
        let sealed = v1.seal(&at("db"), b"hunter2").unwrap();
        assert!(matches!(
            v2.open(&at("db"), &sealed),
            Err(VaultError::Decrypt { .. })
        ));
    }

    #[test]
    fn key_file_is_created_0600_in_0700_directories() {
        let (dir, path, _v) = fresh();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        for d in [dir.path().join("state"), dir.path().join("state/keys")] {
            assert_eq!(fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700);
        }
    }

    #[test]
    fn reopening_decrypts_old_records() {
        let (_d, path, v) = fresh();
        let sealed = v.seal(&at("db"), b"hunter2").unwrap();
        let key_before = fs::read(&path).unwrap();
        drop(v);
        let again = Vault::open_or_create(&path).unwrap();
        assert_eq!(
            fs::read(&path).unwrap(),
            key_before,
            "key file was rewritten"
        );
        assert_eq!(&again.open(&at("db"), &sealed).unwrap()[..], b"hunter2");
    }

    #[test]
    fn group_or_world_readable_key_is_refused() {
        let (_d, path, _v) = fresh();
        for mode in [0o644, 0o640, 0o604, 0o660] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            let err = Vault::open_or_create(&path).unwrap_err();
            assert!(matches!(err, VaultError::Permissions { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains("chmod 600"), "{msg}");
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();
        Vault::open_or_create(&path).expect("owner-only read is fine");
    }

    #[test]
    fn wrong_length_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 16, 31, 33, 64] {
            let path = dir.path().join(format!("key{len}"));
            fs::write(&path, vec![7u8; len]).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            let err = Vault::open_or_create(&path).unwrap_err();
            assert!(matches!(err, VaultError::KeyLength { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("holds {len} bytes")), "{msg}");
            assert_eq!(
                fs::read(&path).unwrap().len(),
                len,
                "must not be overwritten"
            );
        }
    }

    #[test]
    fn a_directory_is_not_a_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Vault::open_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, VaultError::NotAFile { .. }), "{err:?}");
    }

    #[test]
    fn the_canary_opens_only_under_its_key_and_is_no_target_record() {
        let (_d1, p1, v1) = fresh();
        let (_d2, _p2, v2) = fresh();
        let canary = v1.seal_canary().unwrap();
        assert!(v1.opens_canary(&canary));
        assert!(!v2.opens_canary(&canary));
        assert!(Vault::open_existing(&p1).unwrap().opens_canary(&canary));
        // Not a target's record, nor a target's record a canary.
        assert!(v1.open(&at("db"), &canary).is_err());
        let record = v1.seal(&at("db"), b"sshmode vault canary").unwrap();
        assert!(!v1.opens_canary(&record));
        assert!(!Vault::ephemeral().unwrap().opens_canary(&canary));
    }

    #[test]
    fn open_existing_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        let err = Vault::open_existing(&path).unwrap_err();
        assert!(matches!(err, VaultError::Io { .. }), "{err:?}");
        assert!(!path.exists());
    }

    #[test]
    fn debug_shows_no_key_bytes() {
        let (_d, path, v) = fresh();
        let key = fs::read(&path).unwrap();
        let shown = format!("{v:?}");
        assert!(shown.contains("redacted"), "{shown}");
        assert!(!shown.contains(&hex::encode(&key)), "{shown}");
        // Nor any decimal/array rendering of the key's bytes.
        assert!(!shown.contains(&format!("{:?}", &key[..4])), "{shown}");
    }
}
