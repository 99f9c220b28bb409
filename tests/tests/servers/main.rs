//! The integration tests against real servers (Redis nodes, Sentinels,
//! clusters and Redlocks; MariaDB; PostgreSQL; ZooKeeper; etcd), one module
//! per subject, in one test binary.
//!
//! One binary rather than one per file: each binary links every driver and
//! instantiates the runtime's generic code again, so two dozen of them cost
//! the fresh build minutes of compiling and linking the same code (the
//! README's test command on a new machine, and every `.ci/run`). The runner
//! (cargo-nextest) still starts every test in a process of its own.
//!
//! The tests that install the process's global client (`lock_runtime::init`,
//! the attribute's tests: `attribute`, `attribute_backends`, `metrics`,
//! `mysql_attribute`, `zookeeper_attribute`, `global_client`) keep binaries
//! of their own: a constructor that runs before `main` would run before
//! every test here.

mod acl;
mod bad_input_and_server_errors;
mod behaviour;
mod cluster;
mod coalescing;
mod deadlines;
mod election;
mod etcd;
mod exclusion;
mod exit_paths;
mod fair;
mod first_contact;
mod handoff;
mod interop;
mod kinds;
mod mysql;
mod notifications;
mod owner_checks;
mod postgres;
mod protected;
mod redlock;
mod replication;
mod secrets;
mod server_deaths;
mod several_keys;
mod stale_holder;
mod startup;
mod tls;
mod watchdog;
mod zookeeper;
