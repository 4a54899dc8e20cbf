//! Misconfiguration the acquire function refuses by name (`SemaphoreMisconfigured`) before it
//! writes anything, where it would otherwise become a silent hang or a leak (F12):
//!
//! - a caller that is not one of the stack's protected machines (`PROTECTED_STATE_MACHINES`):
//!   the functions may wake, clean up and sweep only those machines' executions;
//! - a caller that is an Express execution: it has no history to clean up from and no
//!   `.waitForTaskToken` to wait in line with;
//! - work that is an Express state machine: its end cannot be seen or stopped, so a cleanup
//!   would free the slot under it. Its type comes from `DescribeStateMachine`, once per machine
//!   per Lambda instance (it is fixed when the machine is created).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_sfn::types::StateMachineType;

use crate::arn::{ArnPatterns, ExecutionArn, ExecutionKind};
use crate::error::HandlerError;
use semaphore_core::flow::answer::{Work, WorkKind};

/// What the acquire function checks a request against besides its input.
#[derive(Debug, Clone, Default)]
pub struct Deployment {
    /// `PROTECTED_STATE_MACHINES`: the machines allowed to take the semaphore. Empty (unset):
    /// every standard execution may (a deployment without the setting, e.g. a test's).
    pub protected: ArnPatterns,
    /// Asks a work machine's type; `None`: not checked.
    pub machine_types: Option<MachineTypes>,
}

/// `DescribeStateMachine`'s type of each work machine, remembered for the Lambda instance.
#[derive(Debug, Clone)]
pub struct MachineTypes {
    client: aws_sdk_sfn::Client,
    known: Arc<Mutex<HashMap<String, StateMachineType>>>,
}

impl MachineTypes {
    pub fn new(client: aws_sdk_sfn::Client) -> Self {
        Self {
            client,
            known: Arc::default(),
        }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig) -> Self {
        Self::new(aws_sdk_sfn::Client::new(sdk))
    }

    /// The machine's type; `None` when it could not be asked (the work's own start then fails
    /// by name if the machine is missing or not allowed).
    async fn of(&self, machine: &str) -> Option<StateMachineType> {
        if let Some(known) = self.known.lock().expect("machine types").get(machine) {
            return Some(known.clone());
        }
        match self
            .client
            .describe_state_machine()
            .state_machine_arn(machine)
            .send()
            .await
        {
            Ok(described) => {
                let kind = described.r#type().clone();
                self.known
                    .lock()
                    .expect("machine types")
                    .insert(machine.to_owned(), kind.clone());
                Some(kind)
            }
            Err(e) => {
                tracing::warn!(machine, error = %aws_sdk_sfn::error::DisplayErrorContext(&e), "DescribeStateMachine of the work failed: its type is not checked");
                None
            }
        }
    }
}

impl Deployment {
    /// Refuses a parked caller (the holder, `$$.Execution.Id`) that the stack does not protect,
    /// and one whose end nobody can see that holds no lease (`leased`): every holder must be
    /// able to end (F13).
    pub fn check_caller(&self, holder: &str, leased: bool) -> Result<(), HandlerError> {
        let Some(execution) = ExecutionArn::parse(holder) else {
            // Not an execution ARN (a caller's own id): no cleanup or sweep can tell that it
            // ended, so only a lease frees what it holds.
            if leased {
                return Ok(());
            }
            return Err(HandlerError::InvalidInput(format!(
                "request.lease is missing: the holder {holder} is not a standard execution's ARN \
                 ($$.Execution.Id), so neither the cleanup nor the sweeper can see when it ends \
                 and free what it holds: pass \"lease\" in seconds (and renew it with \
                 heartbeats), or pass \"execution.$\": \"$$.Execution.Id\""
            )));
        };
        if execution.kind == ExecutionKind::Express {
            return Err(HandlerError::Misconfigured(format!(
                "{holder} is an execution of an Express state machine, which cannot take this \
                 semaphore: Step Functions cannot describe an Express execution or read its \
                 history, so the cleanup and the sweeper could never free what it holds, and it \
                 cannot wait in line (no .waitForTaskToken). Use a STANDARD state machine"
            )));
        }
        if self.protected.is_empty() || self.protected.covers(&execution) {
            return Ok(());
        }
        Err(HandlerError::Misconfigured(format!(
            "{holder} is an execution of state machine {}, which this stack does not protect \
             (its PROTECTED_STATE_MACHINES: {}): its waiters would never be woken and a slot \
             it holds when it fails would not be cleaned up. Name the machine under the \
             stack's ProtectedStateMachinePrefix parameter (or set that prefix to cover it)",
            execution.machine, self.protected
        )))
    }

    /// Refuses work that is an Express state machine.
    pub async fn check_work(&self, work: &Work) -> Result<(), HandlerError> {
        let (Some(types), WorkKind::StateMachine) = (&self.machine_types, work.kind) else {
            return Ok(());
        };
        if types.of(&work.state_machine).await == Some(StateMachineType::Express) {
            return Err(HandlerError::Misconfigured(format!(
                "the work {} is an Express state machine, which cannot run under this \
                 semaphore: Step Functions cannot describe or stop an Express execution, so a \
                 cleanup could neither see nor stop the work of an execution that ended, and \
                 would free its slot while it runs. Use a STANDARD state machine as the work, \
                 or keep it out of the stack's WorkStateMachinePrefix",
                work.state_machine
            )));
        }
        Ok(())
    }
}
